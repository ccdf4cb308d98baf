"""Running ``ip`` and ``tc``: privilege and tool checks, batches, and one-line errors."""

from __future__ import annotations

import os
import shutil
import subprocess

from dpcomm.errors import UserError

__all__ = ["TestbedError", "require", "run", "batch", "netns_list"]


class TestbedError(UserError):
    """The emulated cluster cannot be built, found or used; one line."""

    __test__ = False


def require() -> None:
    """Root and the ``ip`` and ``tc`` tools (iproute2), or a one-line :class:`TestbedError`."""
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        raise TestbedError(f"the testbed needs {' and '.join(missing)} (iproute2) on PATH")
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs root (network namespaces, bridges and tc); run it as root")


def run(argv: list[str], *, input: str | None = None, check: bool = True, timeout: float = 60) -> str:
    """Run a command, return its stdout; a failure is a :class:`TestbedError` naming the command."""
    try:
        p = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise TestbedError(f"{argv[0]}: not found") from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"{' '.join(argv[:6])}: timed out after {timeout:g} s") from None
    if check and p.returncode != 0:
        err = (p.stderr or p.stdout).strip().splitlines()
        raise TestbedError(f"{' '.join(argv[:6])}: {err[-1] if err else f'exit {p.returncode}'}")
    return p.stdout


def batch(tool: str, netns: str | None, lines: list[str]) -> None:
    """Run many ``ip``/``tc`` commands in one process (``-batch -``), optionally inside ``netns``."""
    if not lines:
        return
    argv = [tool] + (["-n", netns] if netns else []) + ["-batch", "-"]
    run(argv, input="\n".join(lines) + "\n")


def netns_list() -> list[str]:
    """Names of all network namespaces (``ip netns list`` prints ``name (id: N)``)."""
    return [line.split()[0] for line in run(["ip", "netns", "list"]).splitlines() if line.strip()]
