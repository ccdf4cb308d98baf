"""Plain TCP connections between emulated servers, to see how a link is shared: one server sends to others,
each connection starting after its own delay, and the seconds each took come back.

Each receiver is ``python -c`` inside its server's namespace, accepting one connection on port 5001 and
reading until it closes; each sender connects after its delay, sends its bytes, half-closes and waits for the
receiver to close (so the time counts delivery, not the socket buffer). Used by
``tests/test_testbed.py`` and ``benchmarks/testbed_host_queue.py`` (the numbers in ``docs/testbed.md``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from dpcomm.testbed.shell import TestbedError

__all__ = ["send_from"]

PORT = 5001
_SCRIPT = f"""
import socket, sys, time
if sys.argv[1] == "recv":
    c, _ = socket.create_server(("0.0.0.0", {PORT})).accept()
    while c.recv(1 << 20):
        pass
    c.close()
else:  # send DST BYTES DELAY_S: print the seconds from connect to the receiver's close
    time.sleep(float(sys.argv[4]))
    c = socket.create_connection((sys.argv[2], {PORT}))
    t = time.perf_counter()
    c.sendall(b"x" * int(sys.argv[3]))
    c.shutdown(socket.SHUT_WR)
    c.recv(1)
    print(time.perf_counter() - t)
"""


def _ip(state: dict[str, Any], server: int) -> str:
    return state["servers"][server]["nics"][0]["address"].split("/")[0]


def send_from(
    state: dict[str, Any], src: int, flows: list[tuple[int, int, float]], timeout: float = 60
) -> list[float]:
    """Server ``src`` sends ``(dst, bytes, delay_s)`` for every flow (distinct ``dst``), all started together;
    returns each connection's seconds, from its connect to the receiver closing."""
    ns = [s["netns"] for s in state["servers"]]
    run = ["ip", "netns", "exec"]
    recv = [subprocess.Popen([*run, ns[d], sys.executable, "-c", _SCRIPT, "recv"]) for d, _, _ in flows]
    try:
        time.sleep(0.5)  # the receivers listen
        send = [
            subprocess.Popen(
                [*run, ns[src], sys.executable, "-c", _SCRIPT, "send", _ip(state, d), str(n), str(w)],
                stdout=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for d, n, w in flows
        ]
        out = [p.communicate(timeout=timeout) for p in send]
        if any(p.returncode for p in send):
            raise TestbedError(
                f"a sender from server {src} failed: exit codes {[p.returncode for p in send]}"
            )
        return [float(o[0]) for o in out]
    finally:
        for p in recv:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
