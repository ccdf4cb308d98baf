"""An nccl-tests-style benchmark of the registered collectives on P local workers (``dpcomm bench``).

:func:`run_bench` starts ``P`` workers (:func:`dpcomm.launch.launch`: gloo on 127.0.0.1) and, for every
(op, bytes, algo), runs ``warmup`` untimed calls on fresh copies of the input (the first one checked), then
a barrier, then ``iters`` calls run back to back on the same buffer (as nccl-tests times its loop: one
barrier's skew is spread over the loop; a summed buffer grows, floats up to inf, which costs the same).
Inputs live on the group's device (:func:`dpcomm.timing.group_device`: CUDA under NCCL), and the loop ends
once that device has finished the calls' work (:func:`dpcomm.timing.time_calls`).
Reported, as nccl-tests does:

* ``time_s``: the maximum over ranks of each rank's mean call time (a collective ends when its slowest
  rank does); with ``repeat > 1`` the whole sweep runs that many times and each case keeps its best sweep
  (on a machine shared with other jobs, load comes in bursts);
* ``algbw = bytes / time_s``; ``busbw = algbw * factor`` with nccl-tests' factors: allreduce ``2(P-1)/P``
  (the bytes each rank's link must carry), broadcast and reduce ``1``;
* ``check`` (with ``check=True``): every rank's result compared with ``torch.distributed``'s own collective
  on the same input, exactly (inputs are small integers, so every dtype sums exactly): ``ok`` or ``FAIL``;
  ``skipped`` without ``check``, and for ``noop`` (which moves nothing by design).

``bcube`` needs ``P = n^k`` (:func:`dpcomm.topology.bcube_shape`): when P is not such a power,
bcube is left out with a note if other algorithms were asked for, and is an error when it was the only one
or when ``bcube=(n, k)`` was given explicitly.

Fitting alpha, beta and gamma to these rows (``dpcomm bench --fit``) is :mod:`dpcomm.collectives.bench_fit`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any

from dpcomm.errors import UserError
from dpcomm.lifecycle import check_buffer, check_port_free
from dpcomm.ops import OPS

__all__ = [
    "BUSBW_FACTOR",
    "BenchConfig",
    "BenchResult",
    "element_size",
    "Row",
    "busbw_factor",
    "run_bench",
]

_ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8}
_DTYPES = tuple(_ITEMSIZE)


def element_size(dtype: str) -> int:
    """Bytes of one ``dtype`` element (4 for an unknown name: the config then says the name is unknown)."""
    return _ITEMSIZE.get(dtype, 4)


def busbw_factor(op: str, nproc: int) -> float:
    """nccl-tests' bus-bandwidth factor: allreduce ``2(P-1)/P``, broadcast and reduce ``1``."""
    return 2 * (nproc - 1) / nproc if op == "allreduce" else 1.0


BUSBW_FACTOR = {"allreduce": "2(P-1)/P", "broadcast": "1", "reduce": "1"}


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """What to measure. Bad values are a :class:`UserError` (they come from the command line)."""

    nproc: int
    """Local worker processes (>= 1); P = ``nproc * nnodes``."""
    algos: tuple[str, ...]
    """Registered algorithm names, e.g. ``("ring", "lp", "native")``."""
    ops: tuple[str, ...] = OPS
    sizes: tuple[int, ...] = (4, 1024, 65536, 1 << 20)
    """Message sizes in bytes, each a whole number of ``dtype`` elements that fits in memory."""
    dtype: str = "float32"
    iters: int = 5
    """Timed calls per (op, size, algo); the mean is kept."""
    warmup: int = 1
    """Untimed calls first (the check, when on, is one of them)."""
    check: bool = False
    repeat: int = 1
    """Sweeps over all cases in one launch; each case reports its best sweep (a shared machine's load
    comes in bursts). 1: exactly nccl-tests' max over ranks of the mean."""
    bcube: tuple[int, int] | None = None
    """``(n, k)`` for bcube; None: from P."""
    block_bytes: int | None = None
    """LP block size; None: LP's own default (the cost model's optimum)."""
    timeout_s: float = 120.0
    """Process-group timeout: a peer that hangs fails the run after this long."""
    progress: bool = False
    """Rank 0 draws a progress bar on stderr."""
    nnodes: int = 1
    """Machines (static rendezvous at ``master_addr:master_port``, as ``torchrun``; ``testbed launch``)."""
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    """0 picks a free port (one machine only)."""
    notes: tuple[str, ...] = field(default=())
    """Filled by :meth:`resolved`: what was left out and why."""
    device: str = "cpu"
    """``cpu`` (gloo) or ``cuda``: one process per GPU, NCCL, the messages in GPU memory."""

    def __post_init__(self) -> None:
        from dpcomm.collectives.base import resolve
        from dpcomm.devices import check_device
        from dpcomm.launch import check_launch

        check_launch(self.nproc, self.nnodes, self.node_rank, self.master_port, master_addr=self.master_addr)
        check_device(self.device, self.nproc)
        if not self.algos:
            raise UserError("--algos: give at least one algorithm")
        canonical = tuple(dict.fromkeys(resolve(a, what="--algos") for a in self.algos))
        object.__setattr__(self, "algos", canonical)  # bml -> bcube: rows name the canonical algorithm
        if not self.ops:
            raise UserError("--ops: give at least one op")
        for op in self.ops:
            if op not in OPS:
                raise UserError(f"--ops: unknown op '{op}' (choose from {', '.join(OPS)})")
        if not self.sizes or any(s < 0 for s in self.sizes):
            raise UserError("--sizes: give sizes >= 0 bytes")
        if self.dtype not in _DTYPES:
            raise UserError(f"--dtype: unknown dtype '{self.dtype}' (choose from {', '.join(_DTYPES)})")
        esize = _ITEMSIZE[self.dtype]
        for s in self.sizes:  # said here, once, rather than rounded or failed in every worker
            if s % esize:
                raise UserError(f"--sizes: {s} B is not a whole number of {self.dtype} elements ({esize} B)")
            check_buffer(s)
        if not self.timeout_s > 0:
            raise UserError(f"--timeout must be > 0 seconds, got {self.timeout_s}")
        if self.iters < 1 or self.warmup < 0 or self.repeat < 1:
            raise UserError(
                f"need --iters >= 1, --warmup >= 0, --repeat >= 1, "
                f"got {self.iters}, {self.warmup}, {self.repeat}"
            )
        if self.block_bytes is not None and self.block_bytes < 1:
            raise UserError(f"--block-bytes must be >= 1, got {self.block_bytes}")
        if self.bcube is not None and self.world != self.bcube[0] ** self.bcube[1]:
            n, k = self.bcube
            raise UserError(f"--bcube {n},{k} is {n**k} ranks, not {self.world} (--nproc x --nnodes)")
        if self.master_port and self.node_rank == 0:  # before the table's header, not after it
            check_port_free(self.master_port, self.master_addr if self.nnodes == 1 else "")

    @property
    def world(self) -> int:
        """P: every worker on every machine."""
        return self.nproc * self.nnodes

    def resolved(self) -> BenchConfig:
        """The config with bcube dropped (and a note) where P is not ``n^k``; an error if nothing is left."""
        if "bcube" not in self.algos or self.world == 1 or self.bcube is not None:
            return self
        from dpcomm.topology import bcube_shape

        try:
            bcube_shape(self.world)
            return self
        except UserError as exc:
            if self.algos == ("bcube",):
                raise
            note = f"bcube skipped: {exc}"
        algos = tuple(a for a in self.algos if a != "bcube")
        return dataclasses.replace(self, algos=algos, notes=(*self.notes, note))

    def options(self, algo: str) -> dict[str, Any]:
        """Constructor options of ``algo`` from this config."""
        if algo == "bcube" and self.bcube is not None:
            return {"n": self.bcube[0], "k": self.bcube[1]}
        if algo == "lp" and self.block_bytes is not None:
            return {"block_bytes": self.block_bytes}
        return {}


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One measured (op, algo, bytes): the ``--json`` row."""

    op: str
    algo: str
    nproc: int
    bytes: int
    time_s: float
    algbw_GBps: float
    busbw_GBps: float
    check: str
    """``ok``, ``FAIL`` or ``skipped``."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchResult:
    rows: tuple[Row, ...]
    notes: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return any(r.check == "FAIL" for r in self.rows)


# ---------------------------------------------------------------------------------------------- measuring


def _reference(op: str, x: Any, group: Any = None) -> Any:
    import torch.distributed as dist

    y = x.clone()
    if op == "allreduce":
        dist.all_reduce(y, group=group)
    elif op == "broadcast":
        dist.broadcast(y, src=0, group=group)
    else:
        dist.reduce(y, dst=0, group=group)
    return y


def _worker(
    cfg: BenchConfig,
) -> tuple[list[tuple[str, str, int]], list[list[tuple[list[float], bool | None]]]]:
    """One rank: the cases ``(op, algo, bytes)`` in order, and for every rank of the world (all-gathered, so
    each machine sees all) per case ``([mean seconds per sweep], ok or None)``."""
    import torch
    import torch.distributed as dist

    from dpcomm.collectives.base import get
    from dpcomm.launch import init_worker
    from dpcomm.timing import call_op, group_device, rank_input, time_calls, wait

    rank, world = init_worker(timeout_s=cfg.timeout_s, device=cfg.device)  # cuda: LOCAL_RANK's GPU, NCCL
    device = group_device()  # NCCL takes CUDA tensors only; gloo: the CPU
    dtype = getattr(torch, cfg.dtype)
    esize = torch.empty((), dtype=dtype).element_size()
    algos = {a: get(a, **cfg.options(a)) for a in cfg.algos}
    cases = [(op, s, a) for op in cfg.ops for s in cfg.sizes for a in cfg.algos]
    bar = _progress(len(cases) * cfg.repeat) if cfg.progress and rank == 0 else None
    out: list = []
    for sweep in range(cfg.repeat):  # whole sweeps repeated: a burst of load hits one sweep, not one algo
        i = 0
        for op in cfg.ops:
            for size in cfg.sizes:
                numel = max(1, round(size / esize)) if size else 0
                src = rank_input(numel, rank, dtype, device)
                ref = _reference(op, src) if cfg.check and sweep == 0 else None
                buf = torch.empty_like(src)
                for name, algo in algos.items():
                    ok = None
                    for w in range(max(cfg.warmup, 1 if ref is not None else 0)):
                        buf.copy_(src)
                        wait(call_op(algo, op, buf))
                        if w == 0 and ref is not None and name != "noop":  # reduce: only the root's counts
                            ok = bool(torch.equal(buf, ref)) if op != "reduce" or rank == 0 else True
                    buf.copy_(src)
                    # back to back after one barrier, as nccl-tests times its loop
                    mean = time_calls(
                        lambda a=algo, o=op, b=buf: call_op(a, o, b), cfg.iters, barrier="once", device=device
                    )[0]
                    if sweep == 0:
                        out.append((op, name, numel * esize, [mean], ok))
                    else:
                        out[i][3].append(mean)
                    i += 1
                    if bar is not None:
                        bar.advance(f"{op} {name} {_human(numel * esize)}")
    if bar is not None:
        bar.close()
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, [(c[3], c[4]) for c in out])
    dist.destroy_process_group()
    return [c[:3] for c in out], everyone


class _progress:
    """A rich progress bar on stderr (rank 0 of the workers)."""

    def __init__(self, total: int):
        from rich.console import Console
        from rich.progress import Progress

        self.p = Progress(console=Console(stderr=True), transient=True)
        self.p.start()
        self.task = self.p.add_task("bench", total=total)

    def advance(self, what: str) -> None:
        self.p.update(self.task, advance=1, description=what)

    def close(self) -> None:
        self.p.stop()


def run_bench(cfg: BenchConfig) -> BenchResult:
    """Measure every (op, size, algo) of ``cfg`` on ``cfg.nproc`` workers per machine (``cfg.nnodes``)."""
    from dpcomm.launch import LaunchOptions, WorkerFailure, launch

    cfg = cfg.resolved()
    opts = LaunchOptions.of(cfg)
    try:
        cases, per_rank = launch(_worker, opts, cfg)[0]
    except WorkerFailure as exc:
        raise UserError(f"bench: {exc}") from None
    rows = []
    for i, (op, algo, nbytes) in enumerate(cases):
        # per sweep the slowest rank's mean; over sweeps the best (repeat = 1: max over ranks of the mean)
        t = min(max(r[i][0][sweep] for r in per_rank) for sweep in range(cfg.repeat))
        oks = [r[i][1] for r in per_rank]
        check = "skipped" if any(o is None for o in oks) else "ok" if all(oks) else "FAIL"
        algbw = nbytes / t / 1e9 if t > 0 else 0.0
        rows.append(
            Row(
                op=op,
                algo=algo,
                nproc=cfg.world,
                bytes=nbytes,
                time_s=t,
                algbw_GBps=algbw,
                busbw_GBps=algbw * busbw_factor(op, cfg.world),
                check=check,
            )
        )
    return BenchResult(rows=tuple(rows), notes=cfg.notes)


def _human(nbytes: float) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}"
