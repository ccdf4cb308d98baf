"""What :func:`dpcomm.launch.launch` adds around PyTorch's elastic agent so that a run stays private, leaves
nothing behind and ends in one line.

- **A store on loopback.** A local run's c10d store (the rendezvous, and the workers' process-group store)
  is one ``TCPStore`` served by the launcher on a socket bound to ``master_addr`` (127.0.0.1 by default),
  handed to torch as ``master_listen_fd``: torch's own store servers listen on every interface, and the
  store holds pickled state that any client could rewrite. The agent's second, shared store is switched off
  (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) and :func:`dpcomm.launch.init_worker` joins this one
  (``$DPCOMM_STORE``). A port that is taken is one line, ``port P is in use``, before any worker starts.
  Multi-node runs use torch's static rendezvous, which listens on every interface of node 0: there the
  user names the address and port (``--master-addr``/``--master-port``) and the network must be trusted.
- **One scratch folder** per launch, private and removed at exit, for the agent's logs and error files;
  the next launch removes the folder of one killed with ``kill -9`` (:mod:`dpcomm.scratch`).
- **Workers that die with the launcher.** Each worker asks the kernel for SIGKILL when its parent dies
  (``prctl(PR_SET_PDEATHSIG)``), so ``kill -9`` of the launcher leaves no worker behind; ``testbed
  launch`` does the same for the commands it starts in the namespaces (:func:`die_with_parent_preexec`).
- **One Ctrl-C, one line.** The launcher ignores SIGINT for the few milliseconds in which it spawns the
  workers, so they start with SIGINT ignored (an ignored signal stays ignored across ``exec``, and a Python
  that starts that way installs no ``KeyboardInterrupt``): a Ctrl-C while they import torch prints no
  traceback in each. A watcher thread sees the workers exec'd and gives SIGINT back to the launcher
  (through SIGUSR1 to its main thread); Ctrl-C then stops the agent, which stops the workers with SIGTERM.
  A Ctrl-C inside that window (spawning plus a 5 ms poll, tens of milliseconds) is ignored: press again.
  A launcher that starts with SIGINT ignored (a background job of a non-interactive shell) keeps it so.
  In the workers SIGINT and SIGTERM keep their default action (die, silently). SIGTERM to the launcher goes
  to the agent, which stops the workers. Either way :class:`dpcomm.errors.Interrupted` or
  ``KeyboardInterrupt`` reaches the CLI: ``dpcomm: interrupted``, exit 130 or 143.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from dpcomm.errors import UserError

__all__ = [
    "WORKER_BYTES",
    "check_buffer",
    "check_host",
    "check_nproc",
    "check_port_free",
    "die_with_parent_preexec",
    "launcher_signals",
    "local_store",
    "worker_entry",
]

WORKER_BYTES = 256 * 2**20
"""Memory one local worker needs, bytes: an idle gloo worker measured 222 MiB resident (154 MiB
proportional) with torch 2.13 on CPU; training adds its model and batches."""

_HOST = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def check_host(addr: str) -> str:
    """``addr`` if it is an IPv4/IPv6 address or a host name (dot-separated labels), else a one-line
    :class:`UserError`."""
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(addr)
        return addr
    if not _HOST.fullmatch(addr or "") or len(addr) > 253:
        raise UserError(f"--master-addr: {addr!r} is not a host name or an IP address")
    return addr


def check_nproc(nproc: int) -> int:
    """``nproc`` local workers, if this machine's available memory holds them (:data:`WORKER_BYTES` each);
    ``$DPCOMM_MAX_NPROC`` overrides the limit."""
    override = os.environ.get("DPCOMM_MAX_NPROC", "").strip()
    if override.isdigit():
        limit = int(override)
        where = f"DPCOMM_MAX_NPROC={override}"
    else:
        avail = _mem_available()
        limit = max(1, avail // WORKER_BYTES)
        where = f"{avail / 2**30:.1f} GiB available, ~{WORKER_BYTES >> 20} MiB per worker"
    if nproc > limit:
        raise UserError(
            f"--nproc {nproc}: this machine can run about {limit} workers ({where}); "
            f"set DPCOMM_MAX_NPROC={nproc} to try anyway"
        )
    return nproc


def check_buffer(nbytes: int, what: str = "--sizes") -> int:
    """``nbytes`` if one buffer of that size fits in this machine's memory, else a one-line
    :class:`UserError` (said before any worker starts, not by every worker after it has)."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if nbytes > total:
        raise UserError(
            f"{what}: {nbytes:,} bytes is more than this machine's memory ({total / 2**30:.1f} GiB)"
        )
    return nbytes


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _bind(addr: str, port: int) -> socket.socket:
    """A listening socket on ``addr:port``; a taken port or a foreign address is one line."""
    try:
        family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0] if addr else socket.AF_INET
    except socket.gaierror as exc:
        raise UserError(f"--master-addr {addr}: cannot resolve ({exc.strerror})") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store server: TIME_WAIT is fine
    try:
        sock.bind((addr, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == 98:  # EADDRINUSE
            raise UserError(f"port {port} is in use") from None
        raise UserError(f"cannot listen on {addr}:{port} ({exc.strerror})") from None
    sock.set_inheritable(False)
    return sock


def check_port_free(port: int, addr: str = "") -> None:
    """Say now, in one line, if ``addr:port`` cannot be listened on (``""``: every interface, as torch's
    static store of a multi-node run's node 0 listens)."""
    _bind(addr, port).close()


@contextlib.contextmanager
def local_store(addr: str, port: int, timeout_s: float = 60.0) -> Iterator[str]:
    """Serve a ``TCPStore`` on ``addr:port`` (0: a free port) for one local run; yields ``host:port``."""
    from datetime import timedelta

    import torch.distributed as dist

    sock = _bind(addr, port)
    host, port = sock.getsockname()[:2]
    fd = sock.detach()  # the store owns the listening socket from here on, and closes it
    try:
        store = dist.TCPStore(
            host,
            port,
            is_master=True,
            master_listen_fd=fd,
            wait_for_workers=False,
            multi_tenant=True,
            timeout=timedelta(seconds=timeout_s),
        )
    except BaseException:
        os.close(fd)
        raise
    try:
        yield f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    finally:
        del store


@contextlib.contextmanager
def prompt_shutdown(grace_s: float) -> Iterator[None]:
    """When a worker fails, the others get ``grace_s`` to end, then SIGTERM, then ``grace_s`` more before
    SIGKILL (torch's process context waits a fixed 30 s there, ignoring the agent's ``shutdown_timeout``:
    a stopped (SIGSTOP) or wedged worker held a failed run for ``--timeout`` + 30 s)."""
    from torch.multiprocessing.spawn import ProcessContext

    join = ProcessContext.join

    def prompt_join(self: Any, timeout: float | None = None, grace_period: float | None = None) -> bool:
        return join(self, timeout, grace_s if grace_period is None else grace_period)

    ProcessContext.join = prompt_join  # type: ignore[method-assign]
    try:
        yield
    finally:
        ProcessContext.join = join  # type: ignore[method-assign]


@contextlib.contextmanager
def launcher_signals(nproc: int) -> Iterator[None]:
    """SIGINT ignored until the ``nproc`` workers have been spawned (so they start with it ignored), then
    taken back (see the module docstring); every handler the agent installs is put back on the way out.
    Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)
    saved = {s: signal.getsignal(s) for s in sigs}
    on_int = saved[signal.SIGINT]
    if on_int is None or on_int == signal.SIG_DFL:
        on_int = signal.default_int_handler

    def _spawned(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, on_int)

    signal.signal(signal.SIGUSR1, _spawned)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    done = threading.Event()
    watcher = threading.Thread(target=_watch_spawn, args=(nproc, done), daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        for s, h in saved.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def _watch_spawn(nproc: int, done: threading.Event) -> None:
    """Tell the main thread (SIGUSR1) once ``nproc`` children run the spawn entry point: they have been
    exec'd, with SIGINT ignored, and the launcher's own disposition no longer reaches them."""
    me, seen = os.getpid(), set()
    while not done.wait(0.005):
        seen |= _spawned_children(me)  # ever seen: a worker that already ended counts
        if len(seen) >= nproc:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
            return


def _spawned_children(pid: int) -> set[int]:
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
            if ppid == pid:
                with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                    if b"spawn_main" in fh.read():
                        found.add(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # not Linux: the launcher's own clean-up still stops workers


def _die_with_parent(launcher_pid: int | None) -> None:
    """SIGKILL this process when its parent dies; if the parent is already gone, exit now."""
    prctl = _prctl()
    if prctl is None:
        return
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if launcher_pid is not None and os.getppid() != launcher_pid:
        os._exit(1)  # the launcher died between fork and prctl


def die_with_parent_preexec() -> Callable[[], None]:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child gets SIGKILL when this process dies
    (``PR_SET_PDEATHSIG`` survives ``exec``, e.g. through ``ip netns exec``, which execs in place)."""
    prctl, parent = _prctl(), os.getpid()  # resolved here: a forked child should not load libraries

    def _preexec() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(1)

    return _preexec


def worker_entry(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)`` in a worker: die with the launcher, die quietly on SIGINT/SIGTERM, and once ``fn``
    has raised, say nothing more on stderr (:func:`_silence_stderr`)."""
    pid = os.environ.get("DPCOMM_LAUNCHER_PID", "")
    _die_with_parent(int(pid) if pid.isdigit() else None)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        return fn(*args)
    except BaseException:
        _silence_stderr()
        raise


def _silence_stderr() -> None:
    """Point this process's stderr (fd 2) at /dev/null. A failed worker's reason reaches the launcher in
    torch's error record, not on stderr; what follows is noise, e.g. gloo's socket thread aborting the
    process as it exits after a lost peer ("terminate called after throwing an instance of
    'gloo::IoException'" and a faulthandler dump, 8 lines above the one-line error, seen once in a full
    test run)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
