"""A CPU of its own for every emulated server: a CFS bandwidth quota per server (``testbed up --cpus X``).

The testbed's links are shaped, its CPUs were not: every server's processes share this machine's cores.
With more busy processes than cores, a worker computes faster while the others wait for the network and
slower while they compute, so a pull plan that keeps every worker computing at once (one large first
batch) runs slower than one that staggers them (layer by layer), and the same plan measured twice may
differ by 8-12% (``docs/ps.md``). A cluster's servers do not share cores.

``--cpus X`` gives each server a cgroup whose CPU bandwidth is capped at ``X`` cores: at most
``X * PERIOD_US`` microseconds of CPU time per ``PERIOD_US`` for all its processes and threads together
(the kernel's CFS bandwidth control, ``Documentation/scheduler/sched-bwc.rst``). Each server then computes
at the speed of an ``X``-core machine whatever the others do, as long as the quotas add up to at most this
machine's cores (checked). What the kernel does in softirqs (TCP, tbf, the bridges) is charged to
whichever process it interrupts (without ``CONFIG_IRQ_TIME_ACCOUNTING``, as here), so some of one server's
network work lands on another's quota; leave the kernel room (e.g. 0.45 each for four servers on two
cores).

``PERIOD_US`` is 10 ms: a server that has used its quota waits for the next period, so a 0.45-core
server may run 4.5 ms and then pause 5.5 ms. Shorter periods smooth that but cost more timer work; the
kernel's smallest quota is 1 ms, hence ``X >= 0.1``.

Works with cgroup v1 (the ``cpu`` hierarchy, ``cpu.cfs_quota_us``) and v2 (``cpu.max``). The cgroups are
``dpc-<name>/h<i>`` under the cpu controller's root; ``testbed down`` removes them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from dpcomm.errors import UserError
from dpcomm.testbed.names import PREFIX
from dpcomm.testbed.shell import TestbedError

__all__ = [
    "PERIOD_US",
    "check_controller",
    "check_cpus",
    "join_preexec",
    "make_cgroups",
    "quota_us",
    "remove_cgroups",
]

PERIOD_US = 10_000
"""CFS bandwidth period, microseconds."""
_MIN_QUOTA_US = 1_000  # the kernel refuses quotas below 1 ms
_V1 = Path("/sys/fs/cgroup/cpu")
_V2 = Path("/sys/fs/cgroup")


def quota_us(cpus: float) -> int:
    """CPU time per period, microseconds, for ``cpus`` cores."""
    return round(cpus * PERIOD_US)


def check_cpus(cpus: float, servers: int, cores: int | None = None) -> None:
    """A one-line error unless ``cpus`` cores per server fit: quota >= 1 ms, all servers within the cores."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if not cpus * PERIOD_US >= _MIN_QUOTA_US:
        raise UserError(
            f"--cpus {cpus:g} must be at least {_MIN_QUOTA_US / PERIOD_US:g} (the kernel's 1 ms quota)"
        )
    if cpus * servers > cores + 1e-9:
        raise UserError(
            f"{servers} servers x {cpus:g} CPUs = {cpus * servers:g} is more than this machine's {cores} "
            f"cores: the servers would share cores, which --cpus is there to prevent"
        )


def _root(base_v1: Path = _V1, base_v2: Path = _V2) -> tuple[Path, int]:
    """The cpu controller's root directory and cgroup version."""
    if (base_v1 / "cpu.cfs_quota_us").exists():
        return base_v1, 1
    controllers = base_v2 / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return base_v2, 2
    raise TestbedError("--cpus needs the cgroup cpu controller (cgroup v1 'cpu' or v2 'cpu.max'); none here")


def check_controller() -> None:
    """A one-line error unless this machine has the cgroup cpu controller (``up`` asks before it builds)."""
    _root()


def _mkdir(path: Path) -> None:
    try:
        path.mkdir(exist_ok=True)
    except OSError as e:
        raise TestbedError(f"cannot create the cgroup {path}: {e.strerror}") from None


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        raise TestbedError(f"cannot write '{text}' to {path}: {e.strerror}") from None


def make_cgroups(name: str, servers: int, cpus: float, *, root: tuple[Path, int] | None = None) -> list[str]:
    """Create ``dpc-<name>/h<i>`` with a quota of ``cpus`` cores each; returns their paths, by server."""
    base, version = root or _root()
    top = base / f"{PREFIX}{name}"
    _mkdir(top)
    if version == 2:
        _write(base / "cgroup.subtree_control", "+cpu")
        _write(top / "cgroup.subtree_control", "+cpu")
    paths = []
    for s in range(servers):
        d = top / f"h{s}"
        _mkdir(d)
        if version == 1:
            _write(d / "cpu.cfs_period_us", str(PERIOD_US))
            _write(d / "cpu.cfs_quota_us", str(quota_us(cpus)))
        else:
            _write(d / "cpu.max", f"{quota_us(cpus)} {PERIOD_US}")
        paths.append(str(d))
    return paths


def remove_cgroups(name: str | None, *, root: tuple[Path, int] | None = None) -> list[str]:
    """Remove the testbed's cgroups (``None``: every testbed's); returns the removed paths. Their processes
    must be gone (``testbed down`` stops them first); a cgroup still in use is left and not listed."""
    try:
        base, _ = root or _root()
    except TestbedError:
        return []
    removed = []
    tops = [base / f"{PREFIX}{name}"] if name else sorted(base.glob(f"{PREFIX}*"))
    for top in tops:
        if not top.is_dir():
            continue
        for d in sorted(p for p in top.iterdir() if p.is_dir()):
            try:
                d.rmdir()
                removed.append(str(d))
            except OSError:
                pass
        try:
            top.rmdir()
            removed.append(str(top))
        except OSError:
            pass
    return removed


def join_preexec(path: str | None, then: Callable[[], None] | None = None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that moves the child into the cgroup at ``path`` (before ``exec``: everything it
    starts stays there), then runs ``then``. ``path`` None: just ``then``. A cgroup that is gone (removed
    while the testbed's state stayed) is a :class:`TestbedError` here, not in the child."""
    if path is None:
        return then
    procs = os.path.join(path, "cgroup.procs")
    if not os.path.exists(procs):
        raise TestbedError(f"the server's cgroup {path} is gone; rebuild the testbed (down, then up)")

    def _preexec() -> None:
        fd = os.open(procs, os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)
        if then is not None:
            then()

    return _preexec
