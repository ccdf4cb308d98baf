"""Trace-driven timing of one S-SGD iteration under a plan: MG-WFBP Eq. 6-8 and 19-21.

Layers ``l = 0..L-1`` in forward order: forward runs ``0 .. L-1`` back to back (``t_f = sum f_l``), then
backward ``L-1 .. 0``; layer ``l``'s gradient is ready at ``R_l = t_f + sum_{j >= l} b_j``. The plan's
groups are all-reduced one at a time in communication order; a group is ready at ``R`` of its
lowest-index layer and runs from ``max(ready, end of the previous group)`` for ``T_ar(bytes)`` seconds.
``t_iter`` is the end of the last all-reduce (never before ``t_f + t_b``), plus an optional model-update
time ``update_s`` after it. With ``N = 1`` nothing is communicated: ``t_iter = t_f + t_b + update_s``.

Speedup (weak scaling, MG-WFBP Eq. 4): ``S(N) = N * (t_f + t_b + update_s) / t_iter``; efficiency ``S/N``.
Layers with no parameters are fine: a group of 0 bytes costs ``T_ar(0) = 0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpcomm.costmodel.base import CommCost
from dpcomm.errors import UserError
from dpcomm.plan import Plan
from dpcomm.planner import check_nodes
from dpcomm.timeline.span import Span
from dpcomm.trace.format import Trace

__all__ = ["CommEvent", "ComputeEvent", "SimResult", "simulate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeEvent:
    """One layer's forward or backward computation."""

    layer: int
    """Layer index, forward order."""
    name: str
    phase: str
    """``forward`` or ``backward``."""
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CommEvent:
    """One group's all-reduce."""

    group: int
    """Position in communication order (0 = first sent)."""
    layers: tuple[int, ...]
    nbytes: int
    ready_s: float
    """When its lowest-index layer's gradient is ready."""
    start_s: float
    end_s: float
    op: str = "allreduce"
    """The collective: ``allreduce``, or DeAR's ``reduce-scatter`` and ``all-gather``
    (:mod:`dpcomm.sim.dear`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    """Timing of one iteration of ``plan`` on ``nodes`` nodes (seconds throughout)."""

    schedule: str
    nodes: int
    t_f_s: float
    t_b_s: float
    update_s: float
    t_iter_s: float
    t_comm_s: float
    """Sum of all-reduce durations, overlapped or not."""
    t_comm_exposed_s: float
    """``t_iter - (t_f + t_b + update_s)``: communication not hidden behind the backward pass."""
    speedup: float
    efficiency: float
    compute: tuple[ComputeEvent, ...]
    comm: tuple[CommEvent, ...]

    @classmethod
    def of(cls, plan: Plan, nodes: int, t_f: float, t_b: float, update_s: float, t_iter: float,
           compute: list[ComputeEvent], comm: list[CommEvent], t_comm: float | None = None,
           ) -> SimResult:  # fmt: skip
        """A result from its times and events (``t_comm``: the events' durations summed where not given),
        exposed time and speedup derived."""
        compute_s = t_f + t_b + update_s
        speedup = nodes * compute_s / t_iter if t_iter > 0 else float(nodes)
        t_comm = sum(ev.end_s - ev.start_s for ev in comm) if t_comm is None else t_comm
        return cls(schedule=plan.schedule, nodes=nodes, t_f_s=t_f, t_b_s=t_b, update_s=update_s,
                   t_iter_s=t_iter, t_comm_s=t_comm,
                   t_comm_exposed_s=t_iter - compute_s, speedup=speedup, efficiency=speedup / nodes,
                   compute=tuple(compute), comm=tuple(comm))  # fmt: skip

    def __post_init__(self) -> None:
        if self.nodes < 1 or not math.isfinite(self.t_iter_s) or self.t_iter_s < 0:
            raise ValueError("a simulation result needs nodes >= 1 and a finite t_iter >= 0")

    def spans(self) -> list[Span]:
        """The iteration as timeline spans (:mod:`dpcomm.timeline`), the same kind the runtime records: a
        ``compute`` span per layer's forward and backward, a ``comm`` span per group's all-reduce."""
        out = [
            Span(
                name=f"{ev.phase[0].upper()} {ev.name}",
                cat=ev.phase,
                row="compute",
                start=ev.start_s,
                end=ev.end_s,
                args={"layer": ev.layer},
            )
            for ev in self.compute
        ]
        for ev in self.comm:
            lo, hi = ev.layers[0], ev.layers[-1]
            out.append(
                Span(
                    name=f"{ev.op} {lo}" if lo == hi else f"{ev.op} {lo}-{hi}",
                    cat="comm",
                    row="comm",
                    start=ev.start_s,
                    end=ev.end_s,
                    args={"layers": list(ev.layers), "bytes": ev.nbytes, "ready_us": ev.ready_s * 1e6},
                )
            )
        return out


def check_inputs(trace: Trace, plan: Plan, nodes: int, update_s: float) -> int:
    """The node count as an int, after a one-line :class:`UserError` for a plan of another layer count, a
    bad node count or a bad update time."""
    check_nodes(nodes)
    if plan.num_layers != trace.num_layers:
        raise UserError(f"plan has {plan.num_layers} layers but trace '{trace.model}' has {trace.num_layers}")
    if not math.isfinite(update_s) or update_s < 0:
        raise UserError(f"update time must be a finite number >= 0, got {update_s!r}")
    return int(nodes)


def simulate(trace: Trace, plan: Plan, cost: CommCost, nodes: int, update_s: float = 0.0) -> SimResult:
    """Time one iteration (see module docstring). ``cost`` is the all-reduce cost for ``nodes`` nodes.
    A ``dear`` plan is timed as DeAR's schedule (:func:`dpcomm.sim.dear.simulate_dear`)."""
    if plan.sharded:
        from dpcomm.sim.dear import simulate_dear

        return simulate_dear(trace, plan, cost, nodes, update_s)
    nodes = check_inputs(trace, plan, nodes, update_s)
    layers = trace.layers
    compute, t = [], 0.0
    for l, layer in enumerate(layers):
        compute.append(
            ComputeEvent(layer=l, name=layer.name, phase="forward", start_s=t, end_s=t + layer.forward_s)
        )
        t += layer.forward_s
    t_f = t
    ready = [0.0] * len(layers)
    for l in range(len(layers) - 1, -1, -1):
        end = t + layers[l].backward_s
        compute.append(ComputeEvent(layer=l, name=layers[l].name, phase="backward", start_s=t, end_s=end))
        ready[l] = t = end
    t_b = t - t_f
    comm, end, t_comm = [], -math.inf, 0.0
    if nodes > 1:
        for k, g in enumerate(plan.groups):
            nbytes = sum(layers[l].params for l in g) * trace.dtype_bytes
            start = max(ready[g[0]], end)  # groups list layers ascending: g[0] is the lowest index
            dur = cost(nbytes)
            end = start + dur
            t_comm += dur
            comm.append(
                CommEvent(group=k, layers=g, nbytes=nbytes, ready_s=ready[g[0]], start_s=start, end_s=end)
            )
    t_iter = max(t_f + t_b, end) + update_s
    return SimResult.of(plan, nodes, t_f, t_b, update_s, t_iter, compute, comm, t_comm)
