"""Trace-driven timing of one BSP parameter-server iteration: pulls batched by a pull plan (iBatch), forward,
backward, and gradient pushes grouped by a gradient plan.

Source: the iBatch paper (Wang et al.), "Problem Formulation" for the pull/forward part, Fig. 2(a) for the
iteration ``[P_t, FC_t, BC_t, G_t]``; the push part is MG-WFBP's model (:func:`dpcomm.sim.simulate`) with
the push cost in place of the all-reduce cost.

Placement and prices (``W`` workers, ``S`` servers, parameters sharded evenly by bytes; ``alpha``, ``beta``,
``gamma`` of the :class:`~dpcomm.costmodel.Network`; messages on one NIC go one after another, as in
:mod:`dpcomm.costmodel`; all workers pull and push at the same time, as BSP makes them):

``colocated`` (every worker also serves ``1/W``; BigDL, the paper's implementation). Pulling ``m`` bytes, a
    worker receives ``(W-1)/W m`` from ``W-1`` servers and, as a server, sends ``(W-1) m/W``::

        Ts = (W-1) alpha,   Tt(m) = (W-1)/W beta m,   push(m) = Ts + (W-1)/W (beta + gamma) m

    (push then pull is :mod:`dpcomm.costmodel.ps`'s all-reduce, BML's P2P parameter server).
``dedicated`` (``S`` extra server machines; the paper's Fig. 1, BytePS). A server sends ``W m/S`` to ``W``
    workers, a worker receives ``m`` from ``S`` servers; the busier NIC sets the pace::

        Ts = max(W, S) alpha,   Tt(m) = max(1, W/S) beta m,   push(m) = Ts + max(1, W/S) beta m + W/S gamma m

One iteration: the pulls and forward follow the pull model of :mod:`dpcomm.planner.pull` (``F_N``); backward
starts at ``F_N``; each gradient group is pushed once ready, one push at a time; the next iteration's pulls
start when the last push has been summed (BSP), so ``t_iter = F_N + t_b + exposed push``. With ``W = 1``
nothing is sent (the single-machine baseline). Speedup (throughput against one machine, the paper's
metric): ``W (t_f + t_b) / t_iter``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from dpcomm.costmodel import Network
from dpcomm.errors import UserError
from dpcomm.plan import Plan
from dpcomm.planner import make_plan
from dpcomm.planner.pull import PULL_METHODS, PullPlan, ibatch_margin, plan_pulls
from dpcomm.sim.simulator import CommEvent, ComputeEvent, SimResult, simulate
from dpcomm.sim.sweep import SweepRow
from dpcomm.trace.format import Trace

__all__ = ["PLACEMENTS", "PsCost", "is_ps_schedule", "ps_inputs", "ps_sweep", "simulate_ps"]

PLACEMENTS = ("colocated", "dedicated")
PREFIX = "ps-"


@dataclass(frozen=True, slots=True, kw_only=True)
class PsCost:
    """Prices of pulls and pushes for ``workers`` workers and a placement (module docstring)."""

    net: Network
    """alpha (s), beta (s/byte), gamma (s/byte)."""
    workers: int
    """W, data-parallel workers."""
    servers: int = 0
    """S dedicated server machines; 0: co-located (every worker serves ``1/W``)."""
    push_ratio: float = 1.0
    """Bytes on the wire per byte of dense gradient pushed: 1 dense; top-k with ratio ``r`` sends a value and
    a 32-bit index per kept entry, ``2 r`` (Aji and Heafield's sparsification, the paper's Fig. 6)."""

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise UserError(f"workers must be >= 1, got {self.workers}")
        if self.servers < 0:
            raise UserError(f"servers must be >= 1 (or 0 for co-located), got {self.servers}")

    @property
    def placement(self) -> str:
        return "dedicated" if self.servers else "colocated"

    @property
    def startup_s(self) -> float:
        """``Ts``, seconds per pull or push message round."""
        W, S = self.workers, self.servers
        if W == 1 and not S:
            return 0.0
        return (W - 1) * self.net.alpha if not S else max(W, S) * self.net.alpha

    def _share(self) -> float:
        """Bytes on the busiest NIC per byte pulled."""
        W, S = self.workers, self.servers
        return (W - 1) / W if not S else max(1.0, W / S)

    def transfer_s(self, nbytes: float | np.ndarray) -> float | np.ndarray:
        """``Tt``: transfer of one pull of ``nbytes`` (no start-up), seconds."""
        return self._share() * self.net.beta * np.asarray(nbytes, dtype=float)

    def push_s(self, nbytes: float) -> float:
        """One push of ``nbytes`` of gradients, start-up included, seconds (a :class:`CommCost`)."""
        if nbytes <= 0 or (self.workers == 1 and not self.servers):
            return 0.0
        W, S = self.workers, self.servers
        sums = (W - 1) / W if not S else W / S  # bytes summed per byte pushed, on the busiest server
        wire = nbytes * self.push_ratio
        return self.startup_s + self._share() * self.net.beta * wire + sums * self.net.gamma * wire

    __call__ = push_s


def ps_inputs(trace: Trace, cost: PsCost) -> tuple[np.ndarray, np.ndarray, float]:
    """``(C, Tt, Ts)`` of :func:`dpcomm.planner.pull.plan_pulls` for ``trace`` under ``cost``."""
    C = np.array([layer.forward_s for layer in trace.layers], dtype=float)
    m = np.array([trace.layer_bytes(l) for l in range(trace.num_layers)], dtype=float)
    return C, np.asarray(cost.transfer_s(m), dtype=float), cost.startup_s


def is_ps_schedule(name: str) -> bool:
    return str(name).strip().lower().startswith(PREFIX)


def pull_method_of(schedule: str) -> str:
    """``ps-ibatch`` -> ``ibatch``; an unknown method is a one-line :class:`UserError`."""
    method = str(schedule).strip().lower().removeprefix(PREFIX)
    if method not in PULL_METHODS:
        raise UserError(
            f"unknown PS schedule {schedule!r}: use one of {', '.join(PREFIX + m for m in PULL_METHODS)}"
        )
    return method


def simulate_ps(
    trace: Trace, pulls: PullPlan, push: Plan, cost: PsCost, *, name: str | None = None
) -> SimResult:
    """One iteration (module docstring) as a :class:`SimResult`: ``comm`` holds the pulls (groups
    ``0..N-1``, forward order), then the pushes; ``t_comm_exposed_s`` is ``t_iter - (t_f + t_b)``."""
    if pulls.num_layers != trace.num_layers or push.num_layers != trace.num_layers:
        raise UserError(f"plans do not match trace '{trace.model}' ({trace.num_layers} layers)")
    W = cost.workers
    C, Tt, Ts = ps_inputs(trace, cost)
    send = W > 1 or cost.servers > 0
    compute, comm = [], []
    link = t = 0.0
    for k, (a, b) in enumerate(pulls.batches):
        nbytes = sum(trace.layer_bytes(l) for l in range(a, b + 1))
        if send:
            start = link
            link += Ts + float(Tt[a : b + 1].sum())  # P_k
            comm.append(
                CommEvent(
                    group=k,
                    layers=tuple(range(a, b + 1)),
                    nbytes=nbytes,
                    ready_s=start,
                    start_s=start,
                    end_s=link,
                )
            )
            t = max(t, link)
        for l in range(a, b + 1):
            compute.append(
                ComputeEvent(layer=l, name=trace.layers[l].name, phase="forward", start_s=t, end_s=t + C[l])
            )
            t += C[l]
    f_n = t  # F_N
    t_f = float(C.sum())
    back = simulate(trace, push, cost if send else _free, max(W, 2) if send else 1)
    shift = f_n - back.t_f_s  # backward starts at F_N instead of t_f
    compute += [
        ComputeEvent(
            layer=e.layer, name=e.name, phase=e.phase, start_s=e.start_s + shift, end_s=e.end_s + shift
        )
        for e in back.compute
        if e.phase == "backward"
    ]
    n_pulls = len(comm)
    comm += [
        CommEvent(
            group=n_pulls + e.group,
            layers=e.layers,
            nbytes=e.nbytes,
            ready_s=e.ready_s + shift,
            start_s=e.start_s + shift,
            end_s=e.end_s + shift,
        )
        for e in back.comm
    ]
    t_iter = back.t_iter_s + shift
    t_b = back.t_b_s
    speedup = W * (t_f + t_b) / t_iter if t_iter > 0 else float(W)
    return SimResult(
        schedule=name or f"{PREFIX}{pulls.method}",
        nodes=W,
        t_f_s=t_f,
        t_b_s=t_b,
        update_s=0.0,
        t_iter_s=t_iter,
        t_comm_s=sum(e.end_s - e.start_s for e in comm),
        t_comm_exposed_s=t_iter - (t_f + t_b),
        speedup=speedup,
        efficiency=speedup / W,
        compute=tuple(compute),
        comm=tuple(comm),
    )


def _free(_nbytes: float) -> float:
    return 0.0


def ps_sweep(
    trace: Trace,
    net: Network,
    nodes_list: Iterable[int],
    schedules: Sequence[str],
    *,
    servers: int = 0,
    push: str = "wfbp",
    push_ratio: float = 1.0,
) -> list[SweepRow]:
    """Rows like :func:`dpcomm.sim.sweep` for PS schedules ``ps-all``, ``ps-layer``, ``ps-ibatch``,
    ``ps-optimal``; pushes grouped by the gradient schedule ``push`` planned under the push cost.
    ``servers``: 0 co-located, else that many dedicated servers at every node count. ``net`` may be a
    function of the node count (a cluster whose per-node bandwidth shrinks as nodes share NICs)."""
    methods = [pull_method_of(s) for s in schedules]
    rows = []
    for nodes in nodes_list:
        cost = PsCost(
            net=net(int(nodes)) if callable(net) else net,
            workers=int(nodes),
            servers=servers,
            push_ratio=push_ratio,
        )
        push_plan = make_plan(push, trace, cost, max(int(nodes), 1))
        C, Tt, Ts = ps_inputs(trace, cost)
        for method in methods:
            pulls = plan_pulls(C, Tt, Ts, method, margin=ibatch_margin(int(nodes), servers))
            name = f"{PREFIX}{method}"
            res = simulate_ps(trace, pulls, push_plan, cost, name=name)
            shown = Plan(
                schedule=name,
                num_layers=trace.num_layers,
                groups=push_plan.groups,
                meta={**push_plan.meta, "pulls": pulls},
            )
            rows.append(
                SweepRow(
                    nodes=int(nodes),
                    schedule=name,
                    t_iter_s=res.t_iter_s,
                    speedup=res.speedup,
                    efficiency=res.efficiency,
                    t_comm_exposed_s=res.t_comm_exposed_s,
                    planning_s=float(push_plan.meta.get("planning_s", 0.0)),
                    plan=shown,
                    result=res,
                )
            )
    return rows
