"""Faults a run must survive in one piece: a local run listens on loopback only, Ctrl-C and SIGTERM end it
in one line with every worker gone, ``kill -9`` of the launcher takes the workers with it, a killed worker
ends the run, a taken port is one line before any worker starts; ``testbed launch`` workers die with it.

Each case runs the real CLI in a process of its own (a new session, as a terminal's job) with ``TMPDIR``
in the test's folder, so what a run leaves in the temporary directory can be seen. Budget: ~40 s on the
2-core VM (six 2-worker runs, each stopped after its workers start), plus ~10 s for the testbed cases.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

_BENCH = [
    "bench",
    "--nproc",
    "2",
    "--algos",
    "ring",
    "--ops",
    "allreduce",
    "--sizes",
    "1M",
    "--iters",
    "5000",
]


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def _tree(pid: int) -> list[int]:
    kids, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _workers(pid: int) -> list[int]:
    return [p for p in _tree(pid) if "spawn_main" in _cmdline(p)]


def _start(tmp_path: Path, *argv: str) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "dpcomm", *argv]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )


def _wait_for_workers(proc: subprocess.Popen, n: int = 2, settle_s: float = 1.0) -> list[int]:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        found = _workers(proc.pid)
        if len(found) >= n:
            time.sleep(settle_s)
            return found
        time.sleep(0.05)
    out, err = proc.communicate(timeout=30)
    raise AssertionError(f"no {n} workers appeared (exit {proc.returncode}): {err[-2000:]}")


def _gone(pids: list[int], within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _leftovers(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("dpcomm-run-", "torchelastic_")))


def _listening(pids: list[int]) -> list[str]:
    """``host:port`` of every TCP socket in LISTEN state that one of ``pids`` holds (/proc/net/tcp{,6})."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with_target = os.readlink(fd.path)
                if with_target.startswith("socket:["):
                    inodes.add(with_target[8:-1])
        except OSError:
            continue
    out = []
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                f = line.split()
                if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                    continue
                addr_hex, port_hex = f[1].split(":")
                raw = bytes.fromhex(addr_hex)
                # the kernel prints each 32-bit word in host (little-endian) order
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
                out.append(f"{ipaddress.ip_address(raw)}:{int(port_hex, 16)}")
    return out


def _loopback(hostport: str) -> bool:
    ip = ipaddress.ip_address(hostport.rsplit(":", 1)[0])
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


@pytest.mark.slow
def test_a_local_train_listens_on_loopback_only(tmp_path):
    """The c10d store (and gloo) of a local run: what ``ss -ltn`` shows, read from /proc, while it runs."""
    proc = _start(tmp_path, "train", "--nproc", "2", "--iters", "10", "--schedule", "wfbp", "--json")
    seen: set[str] = set()
    while proc.poll() is None:
        seen.update(_listening(_tree(proc.pid)))
        time.sleep(0.05)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    assert seen, "saw no listening socket at all (the run was too short to catch?)"
    assert all(_loopback(s) for s in seen), f"listening beyond loopback: {sorted(seen)}"
    assert _leftovers(tmp_path) == []  # one scratch folder, removed at exit


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "to_group", "status"), [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143)]
)
def test_a_signal_stops_the_run_in_one_line(tmp_path, sig, to_group, status):
    """Ctrl-C (SIGINT to the whole foreground group, as a terminal sends it) or SIGTERM to the launcher."""
    proc = _start(tmp_path, *_BENCH, "--json")
    workers = _wait_for_workers(proc)
    everyone = _tree(proc.pid)
    if to_group:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (status, "dpcomm: interrupted\n")
    assert _gone(everyone, 5.0) == [] and workers
    assert _leftovers(tmp_path) == []


@pytest.mark.slow
def test_ctrl_c_while_workers_start_is_one_line(tmp_path):
    """Ctrl-C while the workers still import torch (a second or more here): no traceback from each of them.
    (The launcher ignores SIGINT for the few milliseconds in which it spawns them: hence the 0.3 s.)"""
    proc = _start(tmp_path, *_BENCH, "--json")
    _wait_for_workers(proc, settle_s=0.3)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (130, "dpcomm: interrupted\n")


@pytest.mark.slow
def test_kill_9_of_the_launcher_takes_the_workers(tmp_path):
    proc = _start(tmp_path, *_BENCH, "--json")
    workers = _wait_for_workers(proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert _gone(workers, 5.0) == []


@pytest.mark.slow
def test_kill_9_of_a_worker_ends_the_run_in_one_line(tmp_path):
    proc = _start(tmp_path, *_BENCH, "--json")
    workers = _wait_for_workers(proc)
    os.kill(workers[-1], signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dpcomm: error: ") and "SIGKILL" in lines[0], err
    assert _gone(workers, 5.0) == [] and _leftovers(tmp_path) == []


def test_a_port_in_use_is_one_line_before_any_worker(tmp_path):
    """Another run's store (here: any listener) on --master-port: one line, no worker, no header."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = _start(tmp_path, *_BENCH, "--master-port", str(port))
        _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (2, f"dpcomm: error: port {port} is in use\n")


# ---------------------------------------------------------------------------------------------------------
# testbed launch: workers run in network namespaces, each in a session of its own


def _testbed_why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, bridges, tc)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    probe = f"h6probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@pytest.fixture
def testbed(tmp_path, monkeypatch):
    why = _testbed_why_not()
    if why:
        pytest.skip(why)
    from dpcomm.testbed import TestbedConfig, build

    monkeypatch.setenv("DPCOMM_TESTBED_DIR", str(tmp_path / "state"))
    name = f"h6{os.getpid() % 100000}"
    build.down(name)
    build.up(TestbedConfig(name=name, topology="star:2", rate_bps=1_000_000_000))
    yield name
    build.down(name)


def _netns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.mark.testbed
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_testbed_launch_workers_die_with_it(testbed, tmp_path, sig):
    """Before: each worker had its own session and outlived a stopped ``testbed launch`` (the next launch
    then failed with EADDRINUSE)."""
    from dpcomm.testbed import names

    sleeper = ["python", "-c", "import time; time.sleep(120)", "{node_rank}"]
    proc = _start(
        tmp_path, "testbed", "launch", "--name", testbed, "--out-dir", str(tmp_path / "o"), "--", *sleeper
    )
    spaces = [names.host_ns(testbed, s) for s in (0, 1)]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(_netns_pids(ns) for ns in spaces):
        time.sleep(0.05)
    workers = [p for ns in spaces for p in _netns_pids(ns)]
    assert len(workers) == 2, "the launch never started its workers"
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=30)
    if sig == signal.SIGTERM:
        assert (proc.returncode, err) == (143, "dpcomm: interrupted\n")
    assert _gone(workers, 5.0) == []
    assert all(_netns_pids(ns) == [] for ns in spaces)
