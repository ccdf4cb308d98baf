"""An nccl-tests-style benchmark of the registered collectives on P local workers (``dpcomm bench``).

:func:`run_bench` starts ``P`` workers (:func:`dpcomm.launch.launch`: gloo on 127.0.0.1) and, for every
(op, bytes, algo), runs ``warmup`` untimed calls on fresh copies of the input (the first one checked), then
a barrier, then ``iters`` calls run back to back on the same buffer (as nccl-tests times its loop: one
barrier's skew is spread over the loop; a summed buffer grows, floats up to inf, which costs the same).
Reported, as nccl-tests does:

* ``time_s``: the maximum over ranks of each rank's mean call time (a collective ends when its slowest
  rank does); with ``repeat > 1`` the whole sweep runs that many times and each case keeps its best sweep
  (on a machine shared with other jobs, load comes in bursts);
* ``algbw = bytes / time_s``; ``busbw = algbw * factor`` with nccl-tests' factors: allreduce ``2(P-1)/P``
  (the bytes each rank's link must carry), broadcast and reduce ``1``;
* ``check`` (with ``check=True``): every rank's result compared with ``torch.distributed``'s own collective
  on the same input, exactly (inputs are small integers, so every dtype sums exactly): ``ok`` or ``FAIL``;
  ``skipped`` without ``check``, and for ``noop`` (which moves nothing by design).

``bcube`` needs ``P = n^k`` (:func:`dpcomm.collectives.bcube.bcube_shape`): when P is not such a power,
bcube is left out with a note if other algorithms were asked for, and is an error when it was the only one
or when ``bcube=(n, k)`` was given explicitly.

:func:`fit_network` fits the network's ``alpha``, ``beta``, ``gamma`` to measured rows by least squares on
relative residuals (weights ``1/t^2``; times span decades), each row predicted by its algorithm's formula in
:mod:`dpcomm.costmodel` (linear in alpha, beta, gamma; LP with the block it actually ran). The fit uses the
algorithms whose formula describes one link per rank (``ring``, ``lp``, ``mst``, ``be``, ``ps``); ``bcube``
(its formula assumes ``k`` NICs) and ``native`` (costed as ring / binomial tree, a stand-in for gloo's
own) are scored against the fitted network but do not steer it; ``auto`` and ``noop`` have no formula.
Each algorithm's own one-algorithm fit is reported alongside: it says whether the formula's *shape* fits.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dpcomm.errors import UserError
from dpcomm.lifecycle import check_buffer, check_host, check_nproc, check_port_free

__all__ = [
    "BUSBW_FACTOR",
    "BenchConfig",
    "BenchResult",
    "FitReport",
    "Row",
    "busbw_factor",
    "fit_network",
    "measure_memory",
    "parse_sizes",
    "run_bench",
]

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
_ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8}
_DTYPES = tuple(_ITEMSIZE)
_OPS = ("allreduce", "broadcast", "reduce")
_FIT_ALGOS = ("ring", "lp", "mst", "be", "ps")
"""Algorithms whose formula models one link per rank: these set the fitted network."""


def busbw_factor(op: str, nproc: int) -> float:
    """nccl-tests' bus-bandwidth factor: allreduce ``2(P-1)/P``, broadcast and reduce ``1``."""
    return 2 * (nproc - 1) / nproc if op == "allreduce" else 1.0


BUSBW_FACTOR = {"allreduce": "2(P-1)/P", "broadcast": "1", "reduce": "1"}


def parse_sizes(text: str | list[str] | tuple[str, ...]) -> tuple[int, ...]:
    """``"4,1K,64K,1M"`` (or a list of such) -> bytes; K/M/G are powers of 1024, an optional ``B``/``iB``."""
    parts = [text] if isinstance(text, str) else list(text)
    out = []
    for item in (s.strip() for part in parts for s in str(part).split(",")):
        if not item:
            continue
        m = re.fullmatch(r"(\d+)\s*([KMG]?)(?:I?B)?", item.upper())
        if not m:
            raise UserError(f"--sizes: cannot read {item!r} as a size in bytes (e.g. 4, 1K, 64K, 16M)")
        out.append(int(m.group(1)) * _UNITS[m.group(2)])
    if not out:
        raise UserError("--sizes: give at least one size")
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """What to measure. Bad values are a :class:`UserError` (they come from the command line)."""

    nproc: int
    """Local worker processes (>= 1); P = ``nproc * nnodes``."""
    algos: tuple[str, ...]
    """Registered algorithm names, e.g. ``("ring", "lp", "native")``."""
    ops: tuple[str, ...] = _OPS
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

    def __post_init__(self) -> None:
        from dpcomm.collectives.base import names

        if isinstance(self.nproc, bool) or not isinstance(self.nproc, int) or self.nproc < 1:
            raise UserError(f"--nproc must be an integer >= 1, got {self.nproc!r}")
        if not self.algos:
            raise UserError("--algos: give at least one algorithm")
        known = names()
        for a in self.algos:
            if a not in known:
                raise UserError(f"--algos: unknown algorithm '{a}' (choose from {', '.join(known)})")
        if not self.ops:
            raise UserError("--ops: give at least one op")
        for op in self.ops:
            if op not in _OPS:
                raise UserError(f"--ops: unknown op '{op}' (choose from {', '.join(_OPS)})")
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
        check_host(self.master_addr)
        check_nproc(self.nproc)
        if self.iters < 1 or self.warmup < 0 or self.repeat < 1:
            raise UserError(
                f"need --iters >= 1, --warmup >= 0, --repeat >= 1, "
                f"got {self.iters}, {self.warmup}, {self.repeat}"
            )
        if self.block_bytes is not None and self.block_bytes < 1:
            raise UserError(f"--block-bytes must be >= 1, got {self.block_bytes}")
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise UserError(
                f"need --nnodes >= 1 and 0 <= --node-rank < nnodes, got {self.nnodes}, {self.node_rank}"
            )
        if not 0 <= self.master_port < 65536 or (self.nnodes > 1 and self.master_port == 0):
            raise UserError(
                f"--master-port must be a port number (and given when --nnodes > 1), got {self.master_port}"
            )
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
        from dpcomm.collectives.bcube import bcube_shape

        try:
            bcube_shape(self.world)
            return self
        except UserError as exc:
            if self.algos == ("bcube",):
                raise
            note = f"bcube skipped: {exc}"
        algos = tuple(a for a in self.algos if a != "bcube")
        return _replace(self, algos=algos, notes=(*self.notes, note))

    def options(self, algo: str) -> dict[str, Any]:
        """Constructor options of ``algo`` from this config."""
        if algo == "bcube" and self.bcube is not None:
            return {"n": self.bcube[0], "k": self.bcube[1]}
        if algo == "lp" and self.block_bytes is not None:
            return {"block_bytes": self.block_bytes}
        return {}


def _replace(cfg: BenchConfig, **changes: Any) -> BenchConfig:
    d = {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}
    d.update(changes)
    return BenchConfig(**d)


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


def _input(numel: int, rank: int, dtype: Any) -> Any:
    import torch

    # small integers (1..7 + rank): sums over <= 64 ranks stay exact even in bfloat16 (8 bits of mantissa)
    # as long as P * (7 + P) <= 256, and in float16 up to 2048.
    return ((torch.arange(numel) % 7) + rank % 8 + 1).to(dtype)


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


def _call(algo: Any, op: str, t: Any) -> None:
    if op == "allreduce":
        algo.allreduce(t)
    elif op == "broadcast":
        algo.broadcast(t, root=0)
    else:
        algo.reduce(t, root=0)


def _worker(
    cfg: BenchConfig,
) -> tuple[list[tuple[str, str, int]], list[list[tuple[list[float], bool | None]]]]:
    """One rank: the cases ``(op, algo, bytes)`` in order, and for every rank of the world (all-gathered, so
    each machine sees all) per case ``([mean seconds per sweep], ok or None)``."""
    import torch
    import torch.distributed as dist

    from dpcomm.collectives.base import get
    from dpcomm.launch import init_worker

    rank, world = init_worker(timeout_s=cfg.timeout_s)
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
                src = _input(numel, rank, dtype)
                ref = _reference(op, src) if cfg.check and sweep == 0 else None
                buf = torch.empty_like(src)
                for name, algo in algos.items():
                    ok = None
                    for w in range(max(cfg.warmup, 1 if ref is not None else 0)):
                        buf.copy_(src)
                        _call(algo, op, buf)
                        if w == 0 and ref is not None and name != "noop":  # reduce: only the root's counts
                            ok = bool(torch.equal(buf, ref)) if op != "reduce" or rank == 0 else True
                    buf.copy_(src)
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(cfg.iters):  # back to back, as nccl-tests times its loop
                        _call(algo, op, buf)
                    mean = (time.perf_counter() - t0) / cfg.iters
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


# ---------------------------------------------------------------------------------------------- memory


def _status_kb(field_name: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field_name} in /proc/self/status")


def _mem_worker(algos: tuple[str, ...], ops: tuple[str, ...], nbytes: int, timeout_s: float) -> list:
    import gc

    import torch
    import torch.distributed as dist

    from dpcomm.collectives import _p2p
    from dpcomm.collectives.base import get
    from dpcomm.launch import init_worker

    rank, _ = init_worker(timeout_s=timeout_s)
    out = []
    for name in algos:
        for op in ops:
            algo = get(name)  # a fresh instance: no buffers kept from an earlier call
            x = _input(max(1, nbytes // 4), rank, torch.float32)
            _p2p._scratch.buf = None  # the calling thread's reusable receive buffer: this call pays for it
            gc.collect()
            dist.barrier()
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # reset the peak RSS (VmHWM) to the current RSS (Linux >= 4.0)
            rss0 = _status_kb("VmRSS")
            _call(algo, op, x)
            out.append((name, op, (_status_kb("VmHWM") - rss0) * 1024))
    dist.barrier()
    dist.destroy_process_group()
    return out


def measure_memory(
    nproc: int,
    algos: tuple[str, ...],
    ops: tuple[str, ...] = _OPS,
    nbytes: int = 16 << 20,
    timeout_s: float = 120,
) -> list[dict[str, Any]]:
    """Extra resident memory of one call per (algo, op): the peak RSS during the call minus the RSS before
    it (Linux ``VmHWM`` after resetting it through ``/proc/self/clear_refs``), max over ranks, for a float32
    message of ``nbytes``. Counts every thread's allocations (gloo's included); first call of a fresh
    instance, so buffers an algorithm keeps for later calls are charged here."""
    from dpcomm.launch import LaunchOptions, launch

    # A fixed mmap threshold: every buffer >= 64 KiB is its own mapping, returned to the OS when freed
    # (glibc's dynamic threshold would serve later buffers from freed heap memory, already resident).
    env = {"MALLOC_MMAP_THRESHOLD_": str(64 * 1024)}
    per_rank = launch(_mem_worker, LaunchOptions(nproc=nproc, env=env), algos, ops, nbytes, timeout_s)
    rows = []
    for i, (algo, op, _) in enumerate(per_rank[0]):
        extra = max(r[i][2] for r in per_rank)
        rows.append({"algo": algo, "op": op, "nproc": nproc, "bytes": nbytes, "extra_bytes": extra})
    return rows


def _human(nbytes: float) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}"


# ---------------------------------------------------------------------------------------------- fitting


@dataclass(frozen=True, slots=True, kw_only=True)
class FitReport:
    """How well one algorithm's formula predicts its own rows."""

    algo: str
    rows: int
    in_fit: bool
    """Whether its rows set the joint network."""
    median_rel_err: float
    """Median ``|predicted - measured| / measured`` with the joint network."""
    max_rel_err: float
    own_median_rel_err: float
    """The same with alpha, beta, gamma fitted to this algorithm's rows alone (NaN if < 2 rows)."""


def _features(op: str, algo: str, nbytes: int, nodes: int, block_bytes: int | None) -> np.ndarray | None:
    """``(dT/d alpha, dT/d beta, dT/d gamma)`` of ``algo``'s formula, which is linear in them (LP with the
    block it ran with: ``block_bytes``, or LP's default, the optimum for its default network ``10gbe``)."""
    from dpcomm.collectives.bcube import bcube_shape
    from dpcomm.costmodel.collective import ALGORITHMS, collective_cost
    from dpcomm.costmodel.lp import lp_optimal_block
    from dpcomm.costmodel.network import Network, resolve_network

    if algo not in ALGORITHMS:
        return None
    opts: dict[str, Any] = {}
    if algo == "bcube":
        n, k = bcube_shape(nodes)
        opts = {"n": n, "k": k}
    if algo == "lp":
        opts = {"block_bytes": block_bytes or lp_optimal_block(nbytes, nodes, resolve_network("10gbe"), op)}
    units = [Network(name="unit", alpha=a, beta=b, gamma=g) for a, b, g in ((1, 0, 0), (0, 1, 0), (0, 0, 1))]
    return np.array([collective_cost(op, algo, nbytes, nodes, u, **opts) for u in units])


def _nnls_relative(A: np.ndarray, t: np.ndarray) -> np.ndarray:
    from scipy.optimize import nnls

    x, _ = nnls(A / t[:, None], np.ones_like(t))  # minimise sum ((A x - t) / t)^2 with x >= 0
    return x


def fit_network(rows: list[Row] | tuple[Row, ...], name: str = "bench-fit", block_bytes: int | None = None):
    """Fit ``Network(alpha, beta, gamma)`` to measured rows; returns ``(network, [FitReport per algo])``.

    ``block_bytes`` is the LP block the rows were measured with (None: LP's default optimum).
    """
    from dpcomm.costmodel.network import Network

    usable = []
    for r in rows:
        if r.nproc < 2 or r.bytes == 0 or r.time_s <= 0:
            continue
        f = _features(r.op, r.algo, r.bytes, r.nproc, block_bytes)
        if f is not None and f.any():
            usable.append((r, f))
    fit_rows = [(r, f) for r, f in usable if r.algo in _FIT_ALGOS] or usable
    if len(fit_rows) < 2:
        raise UserError("--fit needs at least two measured rows with P >= 2 and bytes > 0")
    A = np.array([f for _, f in fit_rows])
    t = np.array([r.time_s for r, _ in fit_rows])
    alpha, beta, gamma = _nnls_relative(A, t)
    fit_algos = sorted({r.algo for r, _ in fit_rows})
    net = Network(
        name=name,
        alpha=float(alpha),
        beta=float(beta),
        gamma=float(gamma),
        source=f"dpcomm bench --fit: {len(fit_rows)} rows of {', '.join(fit_algos)}",
    )
    reports = []
    for algo in dict.fromkeys(r.algo for r, _ in usable):
        mine = [(r, f) for r, f in usable if r.algo == algo]
        Am = np.array([f for _, f in mine])
        tm = np.array([r.time_s for r, _ in mine])
        err = np.abs(Am @ np.array([alpha, beta, gamma]) - tm) / tm
        own = np.abs(Am @ _nnls_relative(Am, tm) - tm) / tm if len(mine) >= 2 else np.array([math.nan])
        reports.append(
            FitReport(
                algo=algo,
                rows=len(mine),
                in_fit=any(r.algo == algo for r, _ in fit_rows),
                median_rel_err=float(np.median(err)),
                max_rel_err=float(err.max()),
                own_median_rel_err=float(np.median(own)),
            )
        )
    return net, reports
