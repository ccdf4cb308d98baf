"""Start workers with PyTorch's own launcher machinery (what ``torchrun`` runs: the elastic agent).

``launch(fn, nproc, *args)`` runs ``fn(*args)`` in ``nproc`` local worker processes that find each other
through a c10d store the launcher serves on 127.0.0.1 only (or, with ``nnodes > 1``, a static rendezvous at
``master_addr``, as ``torchrun --nnodes N --node-rank R --master-addr A`` does, which listens on every
interface of node 0) and returns their results by local rank. The store, workers dying with the launcher
and one-line interrupts are :mod:`dpcomm.lifecycle`'s; the scratch folder (and a killed launcher's, removed
by the next launch) :mod:`dpcomm.scratch`'s.
Inside a worker, :func:`init_worker` joins the default process group. ``fn`` must be a module-level
function (workers are spawned). On GPUs (``device="cuda"``) a worker is one process per GPU, as ``torchrun``
runs them: the GPU of its ``LOCAL_RANK`` (:mod:`dpcomm.devices`) is made current before the group, which is
bound to it (``device_id=`` where torch takes it, :mod:`dpcomm.compat`), so NCCL's communicator and every
barrier use that GPU.

A worker that fails makes the launch raise :class:`WorkerFailure`, whose one-line message names the rank
and its exception.

The multi-node option set is defined once, here: :func:`add_launch_arguments` gives a command
``--nnodes --node-rank --master-addr --master-port`` (torchrun's names), :func:`launch_options_from_args`
turns the parsed flags into :class:`LaunchOptions` (a bad value is a one-line :class:`UserError`), and
:func:`takes_launch_arguments` tells ``testbed launch`` whether a command has them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import ipaddress
import logging
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dpcomm import lifecycle, scratch
from dpcomm.devices import worker_device
from dpcomm.errors import Interrupted, UserError

__all__ = [
    "LAUNCH_FLAGS",
    "LaunchOptions",
    "WorkerFailure",
    "add_launch_arguments",
    "check_launch",
    "init_worker",
    "launch",
    "launch_options_from_args",
    "takes_launch_arguments",
]

_LAUNCH_ARGS = (  # flag, default (read as text), help: torchrun's names
    ("--nnodes", "1", "machines (static rendezvous, as torchrun; default 1)"),
    ("--node-rank", "0", "this machine's rank (default 0)"),
    ("--master-addr", "127.0.0.1", "rendezvous host (default 127.0.0.1)"),
    ("--master-port", "0", "rendezvous port (0: pick one; one machine)"),
)
LAUNCH_FLAGS = tuple(flag for flag, _, _ in _LAUNCH_ARGS)
"""The multi-node flags, named as ``torchrun`` names them."""
_MARK = "_dpcomm_launch_flags"  # a parser default that says the flags were added


class WorkerFailure(RuntimeError):
    """One or more workers exited with an error; ``failures`` maps global rank to its one-line message."""

    def __init__(
        self,
        failures: dict[int, str],
        *,
        role: Callable[[int], str] = lambda _rank: "worker",
        secondary: Callable[[str], bool] = lambda _msg: False,
    ):
        """The message names the lowest rank whose failure is not ``secondary`` (a rank that stopped because
        a peer did), else the lowest rank, as ``role(rank)`` (``worker``, ``server``)."""
        self.failures = failures
        first = min(failures, key=lambda r: (secondary(failures[r]), r))
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        super().__init__(f"{role(first)} rank {first} failed: {failures[first]}{more}")

    def named(self, role: Callable[[int], str], secondary: Callable[[str], bool]) -> WorkerFailure:
        """The same failures with ranks named by ``role`` and the cause first (see ``__init__``)."""
        return WorkerFailure(self.failures, role=role, secondary=secondary)


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchOptions:
    """Where and how many workers to start."""

    nproc: int
    """Workers on this node (local world size)."""
    nnodes: int = 1
    """Number of nodes (machines); > 1 uses a static rendezvous at ``master_addr``."""
    node_rank: int = 0
    """This node's rank among ``nnodes``."""
    master_addr: str = "127.0.0.1"
    """Rendezvous host; stays on loopback unless the user names another host of theirs."""
    master_port: int = 0
    """Rendezvous port; 0 picks a free one (single node only)."""
    env: dict[str, str] | None = None
    """Extra environment variables for the workers."""
    quiet: bool = True
    """Silence the elastic agent's own logging (worker failures still surface as :class:`WorkerFailure`)."""

    def __post_init__(self) -> None:
        check_launch(self.nproc, self.nnodes, self.node_rank, self.master_port, master_addr=self.master_addr)

    @classmethod
    def of(cls, cfg: Any) -> LaunchOptions:
        """From any config with ``nproc``, ``nnodes``, ``node_rank``, ``master_addr`` and ``master_port``
        (``TrainConfig``, ``BenchConfig``, the parsed flags of a worker command)."""
        return cls(
            nproc=cfg.nproc,
            nnodes=cfg.nnodes,
            node_rank=cfg.node_rank,
            master_addr=cfg.master_addr,
            master_port=cfg.master_port,
        )


def check_launch(
    nproc: int, nnodes: int, node_rank: int, master_port: int, *, master_addr: str | None = None
) -> None:
    """The one check of a launch's numbers (and ``master_addr``, when given); a :class:`UserError` naming the
    flag otherwise. ``nproc`` must fit in this machine's memory (:func:`dpcomm.lifecycle.check_nproc`)."""
    for flag, v in (("--nproc", nproc), ("--nnodes", nnodes), ("--node-rank", node_rank)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise UserError(f"{flag} must be an integer, got {v!r}")
    if nproc < 1:
        raise UserError(f"--nproc must be an integer >= 1, got {nproc!r}")
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise UserError(f"need --nnodes >= 1 and 0 <= --node-rank < nnodes, got {nnodes}, {node_rank}")
    if not 0 <= master_port < 65536 or (nnodes > 1 and master_port == 0):
        raise UserError(
            f"--master-port must be a port number (and given when --nnodes > 1), got {master_port}"
        )
    if master_addr is not None:
        lifecycle.check_host(master_addr)
    lifecycle.check_nproc(nproc)


def add_launch_arguments(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    """Add :data:`LAUNCH_FLAGS` to ``parser`` (``required``: no defaults, as on a testbed server).

    Values are read as text and checked by :func:`launch_options_from_args`, so a bad one is one line and
    exit status 2 rather than argparse's usage message.
    """
    for flag, default, help_text in _LAUNCH_ARGS:
        parser.add_argument(flag, required=required, default=default, help=help_text)
    parser.set_defaults(**{_MARK: True})


def takes_launch_arguments(parser: argparse.ArgumentParser) -> bool:
    """Whether :func:`add_launch_arguments` was applied to ``parser`` (a command that can span machines)."""
    return bool(parser.get_default(_MARK))


def _int(flag: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip()
    if not text.lstrip("-").isdigit():
        raise UserError(f"{flag} must be an integer, got {value!r}")
    return int(text)


def launch_options_from_args(
    args: argparse.Namespace, *, nproc: int | None = None, env: dict[str, str] | None = None
) -> LaunchOptions:
    """:class:`LaunchOptions` from flags added by :func:`add_launch_arguments` (``nproc``: else
    ``args.nproc``); a bad value is a one-line :class:`UserError`."""
    return LaunchOptions(
        nproc=_int("--nproc", args.nproc if nproc is None else nproc),
        nnodes=_int("--nnodes", args.nnodes),
        node_rank=_int("--node-rank", args.node_rank),
        master_addr=str(args.master_addr),
        master_port=_int("--master-port", args.master_port),
        env=env,
    )


_AGENT_SIGNALS = "SIGTERM,SIGHUP,SIGQUIT"
"""Signals the elastic agent turns into stopping the workers (SIGINT: ``lifecycle.launcher_signals``)."""


@contextlib.contextmanager
def _patched_env(extra: dict[str, str] | None) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in (extra or {})}
    os.environ.update(extra or {})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _quiet(enabled: bool) -> Iterator[None]:
    # torch gives some of its elastic loggers a level of their own ("Received 15 death signal"): set them all
    # and torch.multiprocessing's "Terminating process N via signal SIGTERM" when one worker fails
    roots = ("torch.distributed.elastic", "torch.multiprocessing")
    names = [
        *roots,
        *(n for n in logging.root.manager.loggerDict if n.startswith(tuple(f"{r}." for r in roots))),
    ]
    logs = [logging.getLogger(n) for n in names]
    levels = [log.level for log in logs]
    if enabled:
        for log in logs:
            log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for log, level in zip(logs, levels, strict=True):
            log.setLevel(level)


_SHUTDOWN_S = 1
"""Seconds the agent waits for workers to end on SIGTERM before it sends SIGKILL."""


def _message(failure: Any) -> str:
    msg = failure.message
    if isinstance(msg, dict):
        msg = msg.get("message", "")
    msg = str(msg or f"exit code {failure.exitcode}")
    if msg.startswith("To enable traceback"):  # torch's placeholder when the process left no error record
        return f"exited with code {failure.exitcode} without a Python exception (killed or os._exit)"
    return msg.strip().splitlines()[-1] if msg.strip() else f"exit code {failure.exitcode}"


def launch(fn: Callable[..., Any], nproc: int | LaunchOptions, *args: Any) -> list[Any]:
    """Run ``fn(*args)`` on every worker; return the list of results indexed by local rank."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from dpcomm import compat  # imports torch: not at module level (netsim's CLI reads the flags above)

    opts = nproc if isinstance(nproc, LaunchOptions) else LaunchOptions(nproc=nproc)
    if opts.nnodes > 1 and opts.node_rank == 0:
        lifecycle.check_port_free(opts.master_port)  # torch's store: *:port
    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(scratch.scratch_dir())  # a killed launcher's folder goes first
        stack.enter_context(scratch.temp_files_in(folder))  # torch's pytorch-errorfile-* go there too
        scratch.quiet_resource_tracker()  # after a kill -9 it removes the semaphores without a warning
        stack.enter_context(lifecycle.prompt_shutdown(_SHUTDOWN_S))  # a failed run ends ~--timeout after
        env = {
            "DPCOMM_LAUNCHER_PID": str(os.getpid()),
            "TORCHELASTIC_SIGNALS_TO_HANDLE": _AGENT_SIGNALS,  # torch sets it; this puts the old one back
        }
        common = dict(
            nproc_per_node=opts.nproc,
            max_restarts=0,
            monitor_interval=0.05,
            start_method="spawn",
            logs_specs=DefaultLogsSpecs(log_dir=str(folder)),
            signals_to_handle=_AGENT_SIGNALS,
            # SIGTERM, then SIGKILL this much later (torch's default is 30 s): a stopped (SIGSTOP) or hung
            # worker cannot act on SIGTERM, and dpcomm's workers need no time to clean up (they die on it);
            # a torch without the keyword keeps its 30 s (dpcomm.compat.launch_config)
            shutdown_timeout=_SHUTDOWN_S,
        )
        if opts.nnodes == 1:
            store = stack.enter_context(lifecycle.local_store(opts.master_addr, opts.master_port))
            env |= {"DPCOMM_STORE": store, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
            if "GLOO_SOCKET_IFNAME" not in {**os.environ, **(opts.env or {})} and _is_loopback(
                opts.master_addr
            ):
                env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's own listeners on loopback too, not the host name's
            cfg = compat.launch_config(
                min_nodes=1,
                max_nodes=1,
                run_id=f"dpcomm-{uuid.uuid4().hex[:8]}",
                rdzv_backend="c10d",
                rdzv_endpoint=store,
                rdzv_configs={"is_host": False},  # a client of the launcher's store
                local_addr=opts.master_addr,
                **common,
            )
        else:
            cfg = compat.launch_config(
                min_nodes=opts.nnodes,
                max_nodes=opts.nnodes,
                run_id="dpcomm",
                rdzv_backend="static",
                rdzv_endpoint=f"{opts.master_addr}:{opts.master_port}",
                rdzv_configs={"rank": opts.node_rank, "timeout": 900},
                **common,
            )
        stack.enter_context(_patched_env({**(opts.env or {}), **env}))
        stack.enter_context(_quiet(opts.quiet))
        stack.enter_context(lifecycle.launcher_signals(opts.nproc))
        try:
            out = elastic_launch(cfg, lifecycle.worker_entry)(fn, *args)
        except ChildFailedError as exc:
            if any(f.exitcode == -signal.SIGINT for f in exc.failures.values()):
                raise Interrupted(signal.SIGINT) from None  # Ctrl-C reached the workers first
            raise WorkerFailure({rank: _message(f) for rank, f in exc.failures.items()}) from None
        except SignalException as exc:
            raise Interrupted(int(exc.sigval)) from None
    base = opts.node_rank * opts.nproc
    return [out[base + i] if base + i in out else out[i] for i in range(opts.nproc)]


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


def init_worker(
    backend: str | None = None, timeout_s: float = 60.0, *, device: str = "cpu"
) -> tuple[int, int]:
    """Join the default process group from the launcher's environment; returns ``(rank, world_size)``.

    ``timeout_s`` bounds every collective and point-to-point wait of the group, so a peer that dies turns
    into an error on the others instead of a hang. ``device``: ``cpu``, or ``cuda``: this worker's GPU
    (:func:`dpcomm.devices.worker_device`) becomes the current device *before* the group is made, and the
    group is bound to it. ``backend``: default gloo on the CPU, NCCL on GPUs.
    """
    import torch
    import torch.distributed as dist

    from dpcomm import compat

    dev = worker_device(device)
    backend = backend or ("nccl" if dev.type == "cuda" else "gloo")
    if not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)  # before the group: NCCL's communicator and barriers take this GPU
        bind = compat.process_group_kwargs(dev)
        timeout = datetime.timedelta(seconds=timeout_s)
        addr = os.environ.get("DPCOMM_STORE")
        if addr:  # a local launch: the launcher's store on loopback (dpcomm.lifecycle)
            host, port = addr.rsplit(":", 1)
            store = dist.TCPStore(host.strip("[]"), int(port), is_master=False, timeout=timeout)
            prefix = f"dpcomm/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/workers"
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            dist.init_process_group(
                backend, store=dist.PrefixStore(prefix, store), rank=rank, world_size=world, timeout=timeout,
                **bind,
            )  # fmt: skip
        else:
            dist.init_process_group(backend, timeout=timeout, **bind)
    return dist.get_rank(), dist.get_world_size()
