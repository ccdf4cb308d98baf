"""The measurements and decisions behind a plan made on real workers (MG-WFBP Alg. 1 lines 1-7: "benchmarks
in the first several iterations"); :mod:`dpcomm.train.online` runs them in order.

1. While the first iterations run with a safe plan, the runtime's hooks time every learnable layer on every
   rank (:func:`dpcomm.runtime.spans.layer_times`; MG-WFBP Table I: t_f^(l), t_b^(l)).
2. The chosen collective's all-reduce is timed at a few message sizes and fitted to ``T(M) = a + b*M``
   (MG-WFBP Eq. 9) -> :class:`~dpcomm.costmodel.base.LinearCost`.
3. Per-layer medians over iterations are averaged over ranks (every rank gets the same numbers); the root
   builds a :class:`~dpcomm.trace.format.Trace`, calls the planner, and broadcasts the plan.
4. Every rank all-gathers :meth:`Plan.sha256` and refuses to go on if any rank holds a different plan
   (:func:`dpcomm.runtime.broadcast.check_same_plan`).
5. For the cost-model planners (``mgwfbp``, ``optimal``), measure instead of trusting the model where it may
   be wrong: the planned plan, ``single`` and DDP's default buckets run round-robin for a few iterations each
   (:class:`Trial`) and the fastest median, as the slowest rank saw it, is kept (of plans within 2% of it,
   the one with the fewest messages). The alpha-beta model of
   MG-WFBP (Eq. 9) prices a message by its own time only; on CPU workers that also do the reductions (one
   machine, loopback), each overlapped message also takes CPU time from backward, which it does not model.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from dpcomm.costmodel.base import CommCost, LinearCost
from dpcomm.costmodel.fit import fit_line
from dpcomm.errors import UserError
from dpcomm.plan import Plan
from dpcomm.planner.schedule import PlannerSchedule
from dpcomm.timing import group_device, slowest, time_calls, wait
from dpcomm.trace.format import Layer, Trace

__all__ = [
    "MEASURED",
    "Trial",
    "candidates",
    "build_trace",
    "fit_linear",
    "measure_allreduce",
    "measure_halves",
    "median_layer_times",
    "network_cost",
    "plan_on_root",
    "rank_mean",
]


MEASURED = ("mgwfbp", "optimal")
"""Planner names whose plan is checked against measured fallbacks (:class:`Trial`)."""


def rank_mean(values: list[float], group: Any) -> list[float]:
    """Element-wise mean over the ranks of ``group`` (every rank gets the same floats)."""
    t = torch.tensor(values, dtype=torch.float64, device=group_device(group))  # NCCL: on the GPU
    dist.all_reduce(t, group=group)
    return (t / dist.get_world_size(group)).tolist()


def median_layer_times(
    samples: list[tuple[list[float], list[float]]], group: Any
) -> tuple[list[float], list[float]]:
    """``(f, b)``: per layer, the median over profiled iterations, then the mean over ranks."""
    n = len(samples[0][0])
    f = [statistics.median(s[0][l] for s in samples) for l in range(n)]
    b = [statistics.median(s[1][l] for s in samples) for l in range(n)]
    fb = rank_mean(f + b, group)
    return fb[:n], fb[n:]


def network_cost(network: Any, nodes: int, collective: str) -> CommCost:
    """The all-reduce cost of ``collective`` on a modelled network (a Network, preset name or JSON file)."""
    from dpcomm.costmodel import allreduce_cost
    from dpcomm.costmodel.network import Network, resolve_network

    net = network if isinstance(network, Network) else resolve_network(network)
    return allreduce_cost(net, nodes, collective)


def measure_allreduce(
    allreduce: Callable[[torch.Tensor], Any], scratch: torch.Tensor, group: Any, reps: int = 3
) -> list[tuple[int, float]]:
    """``[(bytes, seconds)]``: median time of ``allreduce`` on slices of ``scratch`` at a few sizes.

    Sizes go down from the whole buffer by factors of 4 (at most 5 sizes); each is run once to warm up and
    ``reps`` times timed. Every rank runs the same calls; the slowest rank's median counts (max over ranks),
    since a collective ends for everyone only when the slowest member is done. ``scratch`` is overwritten.
    A call counts until its work is done (:func:`dpcomm.timing.time_calls`): a work handle ``allreduce``
    returns is waited for, and ``scratch``'s device synchronized (NCCL only enqueues on a CUDA stream).
    """
    n = scratch.numel()
    sizes = sorted({max(1, n // 4**k) for k in range(5)})
    times = []
    for m in sizes:
        piece = scratch.narrow(0, 0, m)
        piece.zero_()
        wait(allreduce(piece))  # warm-up
        runs = time_calls(
            lambda piece=piece: allreduce(piece), reps, barrier="none", group=group, device=scratch.device
        )
        times.append(statistics.median(runs))
    worst = slowest(times, group)  # a collective ends for everyone when its slowest member is done
    return [(m * scratch.element_size(), t) for m, t in zip(sizes, worst, strict=True)]


def measure_halves(
    call: Callable[..., Any], scratch: torch.Tensor, group: Any, allreduce: CommCost
) -> tuple[CommCost, dict[str, list[tuple[int, float]]]]:
    """The ``dear`` schedule's reduce-scatter and all-gather timed as :func:`measure_allreduce` times the
    all-reduce (``call(t, op)``), each fitted: a :class:`~dpcomm.planner.dear.SplitCost` and the points."""
    from dpcomm.planner.dear import SplitCost

    points = {
        "rs": measure_allreduce(lambda t: call(t, "reduce_scatter"), scratch, group),
        "ag": measure_allreduce(lambda t: call(t, "allgather"), scratch, group),
    }
    return SplitCost(allreduce, fit_linear(points["rs"]), fit_linear(points["ag"])), points


def fit_linear(points: list[tuple[int, float]]) -> LinearCost:
    """Least-squares ``T(M) = a + b*M`` through ``(bytes, seconds)`` points, with ``a, b >= 0``
    (:func:`dpcomm.costmodel.fit.fit_line`); one size only gives a flat cost, their mean."""
    try:
        a, b = fit_line(points, weighting="ols", nonneg=True).coef
    except ValueError:  # a single size: no slope to see
        return LinearCost(max(0.0, statistics.fmean(float(t) for _, t in points)), 0.0)
    return LinearCost(a, b)


def build_trace(
    model: str,
    names: list[str],
    params: list[int],
    f: list[float],
    b: list[float],
    batch: int,
    dtype_bytes: int,
) -> Trace:
    layers = tuple(
        Layer(name=n, params=p, forward_s=fs, backward_s=bs)
        for n, p, fs, bs in zip(names, params, f, b, strict=True)
    )
    return Trace(
        model=model,
        batch_size=max(1, batch),
        device="cpu" if not torch.cuda.is_available() else "cuda",
        dtype_bytes=dtype_bytes,
        layers=layers,
        extra={"measured_by": "dpcomm.DataParallel"},
    )


def plan_on_root(
    schedule: PlannerSchedule, trace: Trace, cost: CommCost, nodes: int, group: Any, root: int
) -> Plan:
    """The root calls the planner and broadcasts the plan (or its error) to every rank of ``group``; the
    plan's ``meta`` travels with it (plain values only)."""
    payload: list[Any] = [None]
    if dist.get_rank(group) == root:
        try:
            plan = schedule.plan(trace, cost, nodes)
            payload[0] = {"plan": plan.to_dict(), "meta": _plain(plan.meta)}
        except Exception as exc:  # noqa: BLE001 - every rank must hear about it, not only the root
            payload[0] = {"error": f"{type(exc).__name__}: {exc}"}
    dist.broadcast_object_list(payload, src=dist.get_global_rank(group, root) if group else root, group=group)
    if "error" in payload[0]:
        raise UserError(f"planning '{schedule.text}' failed on the root: {payload[0]['error']}")
    return Plan(**payload[0]["plan"], meta=payload[0]["meta"])


def _plain(meta: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v for k, v in meta.items() if isinstance(v, int | float | str | bool | list | tuple | type(None))
    }


def ddp_default_plan(trace: Trace, cost: CommCost, nodes: int) -> Plan:
    """DDP's default buckets as a plan (1 MiB first, then 25 MiB), named ``ddp-buckets``."""
    from dpcomm.planner.bucket import DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES, plan_bucket

    first, rest = DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES
    return plan_bucket(trace, cost, nodes, size_bytes=rest, first_bytes=first, name="ddp-buckets")


def candidates(plan: Plan, trace: Trace, cost: CommCost, nodes: int) -> list[Plan]:
    """The planned plan first, then the fallbacks a measurement may prefer: ``single`` (one start-up, no
    overlap) and DDP's default buckets (1 MiB first, then 25 MiB); plans with the same groups appear once."""
    from dpcomm.planner import plan_single

    out = [plan]
    for c in (plan_single(trace, cost, nodes), ddp_default_plan(trace, cost, nodes)):
        if all(c.groups != o.groups for o in out):
            out.append(c)
    return out


class Trial:
    """Candidate plans timed round-robin, one iteration each in turn, so all see the same machine load.

    The seconds :meth:`record` takes are the caller's; on a GPU they must be read with
    :func:`dpcomm.timing.now` (``now(device)`` before the iteration and after its backward), which waits for
    the queued kernels and collectives: ``time.perf_counter()`` alone sees only how long they took to
    enqueue. The runtime's records (``IterRecord.total_s``) are read that way already."""

    def __init__(self, plans: list[Plan], iters: int):
        self.plans, self.iters = plans, iters
        self.times: list[list[float]] = [[] for _ in plans]
        """Per candidate, its measured iteration times (seconds)."""
        self._cur = 0

    @property
    def current(self) -> Plan:
        """The candidate the next iteration runs."""
        return self.plans[self._cur]

    @property
    def complete(self) -> bool:
        return all(len(t) >= self.iters for t in self.times)

    def record(self, seconds: float) -> None:
        """The current candidate's iteration took ``seconds``; move on to the next candidate."""
        self.times[self._cur].append(seconds)
        self._cur = (self._cur + 1) % len(self.plans)

    def choose(self, group: Any, margin: float = 0.02, prefer: int | None = None) -> tuple[Plan, list[float]]:
        """The candidate to keep, and the medians of its iteration times as the slowest rank measured them
        (so every rank chooses the same): of the candidates within ``margin`` (a fraction) of the fastest,
        candidate ``prefer`` if it is one of them, else the one with the fewest messages (groups; the
        earlier candidate on a tie). Fewer messages cost less CPU beside backward and fewer start-ups, so
        where timing cannot tell plans apart they are the safer choice on a busy machine; ``prefer`` is for
        a baseline the user already has (DDP's own buckets), kept unless a plan is measurably faster."""
        med = torch.tensor([statistics.median(t) for t in self.times], dtype=torch.float64)
        if dist.is_initialized() and dist.get_world_size(group) > 1:
            med = med.to(group_device(group))  # NCCL: on the GPU
            dist.all_reduce(med, op=dist.ReduceOp.MAX, group=group)
        medians = med.tolist()
        close = [i for i, m in enumerate(medians) if m <= min(medians) * (1 + margin)]
        best = prefer if prefer in close else min(close, key=lambda i: (len(self.plans[i].groups), i))
        return self.plans[best], medians
