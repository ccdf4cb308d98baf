"""Measure a real allreduce and fit MG-WFBP Eq. 9, ``T_ar(M) = a + b M``, to it (``dpcomm calibrate``).

``calibrate(CalibrateOptions(nproc=P))`` starts ``P`` local workers (:func:`dpcomm.launch.launch`, gloo over
127.0.0.1), times ``torch.distributed.all_reduce`` of float32 tensors over a range of sizes (default 4 KB to
64 MB, x4 apart), takes for each size the *maximum over ranks of the median* of ``iters`` timed calls (an
allreduce ends when its slowest rank ends), and fits ``a`` and ``b`` by least squares, with ``R^2``
(:func:`dpcomm.costmodel.fit.fit_line`).

Two fits: ``relative`` (default) weights each point by ``1/t^2``, i.e. minimises the *relative* residuals, so
the 4 KB points set ``a`` and the 64 MB points set ``b`` (times span four decades; an unweighted fit is set by
the largest sizes alone and its ``a`` is noise, often negative); ``ols`` is plain ordinary least squares.
``R^2`` is reported in the fit's own weighting (``1 - sum w r^2 / sum w (t - mean_w t)^2``).

Assuming the ring algorithm (MG-WFBP Table II: ``a = 2(N-1) alpha``, ``b = 2(N-1)/N beta + (N-1)/N gamma``)
it derives ``alpha = a / (2(N-1))`` and ``beta = b N / (2(N-1))``, with ``gamma = 0``: one fit cannot split
the reduction time from the transfer time, so ``beta`` carries both. The network file it writes keeps the
measured points under ``allreduce_tables[str(P)]``, which :func:`dpcomm.costmodel.allreduce_cost` then
prefers to the fitted line for ``P`` nodes.
"""

from __future__ import annotations

import math
import platform
from dataclasses import dataclass

from dpcomm.costmodel.fit import WEIGHTINGS, fit_line
from dpcomm.costmodel.network import Network
from dpcomm.errors import UserError
from dpcomm.lifecycle import check_buffer, check_nproc

__all__ = [
    "DEFAULT_SIZES",
    "FITS",
    "Calibration",
    "CalibrateOptions",
    "calibrate",
    "ring_alpha_beta",
]

DEFAULT_SIZES: tuple[int, ...] = tuple(4096 * 4**i for i in range(8))  # 4 KiB .. 64 MiB
FITS = WEIGHTINGS
_DTYPE_BYTES = 4  # float32, what S-SGD all-reduces


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrateOptions:
    """What to measure. Invalid values are a :class:`UserError` (they come from the command line)."""

    nproc: int
    """Local worker processes (the node count N of the fit), >= 2."""
    sizes: tuple[int, ...] = DEFAULT_SIZES
    """Message sizes in bytes (rounded up to whole float32 elements); at least two distinct."""
    iters: int = 10
    """Timed calls per size; the median is kept."""
    warmup: int = 2
    """Untimed calls per size first."""
    fit: str = "relative"
    """``relative`` (weights ``1/t^2``) or ``ols`` (unweighted); see the module docstring."""
    name: str = ""
    """Name written into the network file (default ``loopback-gloo-<P>``)."""
    timeout_s: float = 300.0
    """Bound on every collective wait in the workers."""

    def __post_init__(self) -> None:
        if isinstance(self.nproc, bool) or not isinstance(self.nproc, int) or self.nproc < 2:
            raise UserError(
                f"--nproc must be an integer >= 2 (allreduce needs two workers), got {self.nproc!r}"
            )
        if self.iters < 1:
            raise UserError(f"--iters must be >= 1, got {self.iters}")
        if self.warmup < 0:
            raise UserError(f"--warmup must be >= 0, got {self.warmup}")
        if self.fit not in FITS:
            raise UserError(f"--fit must be one of {', '.join(FITS)}, got {self.fit!r}")
        if any(s <= 0 for s in self.sizes):
            raise UserError(f"--sizes must all be > 0 bytes, got {list(self.sizes)}")
        for s in self.sizes:  # said here, once, rather than rounded or failed in every worker
            if s % _DTYPE_BYTES:
                raise UserError(
                    f"--sizes: {s} B is not a whole number of float32 elements ({_DTYPE_BYTES} B)"
                )
            check_buffer(s)
        check_nproc(self.nproc)
        if len({_elements(s) for s in self.sizes}) < 2:
            raise UserError("--sizes needs at least two different sizes to fit a line")


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """The measurement and its fit."""

    nproc: int
    points: tuple[tuple[float, float], ...]
    """(bytes, seconds): per size, the maximum over ranks of the median time."""
    a: float
    """Fitted start-up, seconds (may be negative on a noisy machine; ``alpha`` is then clamped to 0)."""
    b: float
    """Fitted seconds per byte."""
    r2: float
    """Coefficient of determination of the fit, in the fit's weighting."""
    fit: str
    """The fit that made ``a`` and ``b`` (``relative`` or ``ols``)."""
    network: Network
    """alpha and beta derived assuming ring, and the measured table."""


def _elements(nbytes: int) -> int:
    return max(1, math.ceil(nbytes / _DTYPE_BYTES))


def ring_alpha_beta(a: float, b: float, nodes: int) -> tuple[float, float]:
    """Invert ring's ``a = 2(N-1) alpha``, ``b = 2(N-1)/N beta`` (gamma folded into beta).

    A negative ``a`` or ``b`` (noise) clamps to 0.
    """
    if nodes < 2:
        raise ValueError(f"need at least 2 nodes, got {nodes}")
    return max(a, 0.0) / (2 * (nodes - 1)), max(b, 0.0) * nodes / (2 * (nodes - 1))


def _time_allreduce(sizes: list[int], iters: int, warmup: int, timeout_s: float) -> list[float]:
    """Worker: seconds of ``all_reduce`` per size, the slowest rank's median (a barrier before each call)."""
    import torch
    import torch.distributed as dist

    from dpcomm.launch import init_worker
    from dpcomm.timing import time_collective

    torch.set_num_threads(1)  # workers share the machine's cores; one thread each avoids oversubscription
    init_worker("gloo", timeout_s=timeout_s)
    try:
        return time_collective(None, "allreduce", sizes, iters, warmup=warmup, barrier="each", stat="median")
    finally:
        dist.destroy_process_group()


def calibrate(opts: CalibrateOptions) -> Calibration:
    """Launch ``opts.nproc`` workers, time the allreduce, fit, derive the network (module docstring)."""
    import torch

    from dpcomm.launch import launch

    sizes = sorted({_elements(s) * _DTYPE_BYTES for s in opts.sizes})
    per_rank = launch(_time_allreduce, opts.nproc, sizes, opts.iters, opts.warmup, opts.timeout_s)
    points = tuple((float(m), max(r[i] for r in per_rank)) for i, m in enumerate(sizes))
    line = fit_line(points, weighting=opts.fit)
    (a, b), r2 = line.coef, line.r2
    alpha, beta = ring_alpha_beta(a, b, opts.nproc)
    source = (
        f"dpcomm calibrate --nproc {opts.nproc} on {platform.node()}: torch {torch.__version__} gloo "
        f"all_reduce over 127.0.0.1, max over ranks of the median of {opts.iters} calls; alpha, beta from "
        f"the {opts.fit} least-squares fit a={a:.4g} s, b={b:.4g} s/byte (R^2={r2:.4f}) assuming ring; "
        "gamma folded into beta"
    )
    net = Network(
        name=opts.name or f"loopback-gloo-{opts.nproc}",
        alpha=alpha,
        beta=beta,
        gamma=0.0,
        source=source,
        allreduce_tables={opts.nproc: points},
    )
    return Calibration(nproc=opts.nproc, points=points, a=a, b=b, r2=r2, fit=opts.fit, network=net)
