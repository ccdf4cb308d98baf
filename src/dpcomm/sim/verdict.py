"""Which data-parallel schedule is fastest for one job in the model, and by how much: DDP with dpcomm's
best all-reduce plan (``optimal``), DeAR (``dear``: each group reduce-scattered in backward and
all-gathered in the next forward, :mod:`dpcomm.planner.dear`) or FSDP2 (dpcomm's FSDP planner,
:func:`dpcomm.planner.fsdp.plan_fsdp`).

DDP's and DeAR's times are :func:`dpcomm.sim.simulate`'s for their planners' plans on the trace and the
all-reduce cost: the numbers ``dpcomm simulate --schedules optimal,dear`` prints. FSDP2 needs more than
that (its all-gather and reduce-scatter costs, a memory budget, FSDP2's fixed cost per unit), so its time
is the caller's: ``dpcomm plan`` gives ``dpcomm simulate``'s ``fsdp:optimal`` row
(:func:`dpcomm.sim.fsdp.plan_row`, within :data:`GAP`), ``dpcomm.fsdp.shard`` its plan's modelled time;
:func:`fsdp_time_s` plans one from costs. Where FSDP2 cannot be priced, the reason stands in its place.

Times within :data:`TIE_REL` of the fastest tie, and a tie goes to the schedule listed first (DDP, the
simplest to run, then DeAR, then FSDP2). :meth:`Verdict.text` says it in one line::

    fastest in the model: dear, 0.81x of DDP with the optimal plan (145.8 against 180.3 ms); FSDP2 1.12x

:func:`for_allreduce` and :func:`for_fsdp` are the verdicts of ``dpcomm.ddp.wrap`` (a fitted all-reduce
cost; FSDP2's collectives each half of it, as DeAR's) and of ``dpcomm.fsdp.shard`` (fitted all-gather and
reduce-scatter costs: DeAR's halves, and DDP's all-reduce their sum, a ring all-reduce being a
reduce-scatter then an all-gather), with no communication or timing of their own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dpcomm.costmodel.base import CommCost, LinearCost
from dpcomm.errors import UserError
from dpcomm.trace.format import Trace

__all__ = [
    "DDP",
    "DEAR",
    "FSDP2",
    "GAP",
    "TIE_REL",
    "Verdict",
    "fastest",
    "for_allreduce",
    "for_fsdp",
    "fsdp_time_s",
    "verdict",
]

DDP = "optimal"
"""DDP with dpcomm's best all-reduce plan (the planner ``optimal``)."""
DEAR = "dear"
FSDP2 = "FSDP2"
TIE_REL = 1e-3
"""Times within this fraction of the fastest tie (0.1%: below what a timed run resolves)."""
GAP = 0.05
"""FSDP2's ``optimal`` planned within this fraction of its certified lower bound (:func:`fsdp_time_s`,
``dpcomm plan``): a verdict should not wait minutes for a certificate. On 4 ranks of 10 GbE (the 2-core VM)
proving the planner's default 0.5% took 421 s on ``inception-v3-h100-b32`` and 2% 0.65 s; 2% took 38 s
on ``inception-v3-h200bf16-b32`` and 5% 0.5 s; on those and eight other shipped traces (ResNet-50, BERT,
GoogLeNet, TinyLlama, ViT, GPT-2) the plan found at 5% is as fast as the one at 0.5%."""

_LABELS = {DDP: "DDP with the optimal plan"}


def _ms(t: float) -> str:
    return f"{t * 1e3:.4g}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """The schedules' iteration times in the model and which is fastest."""

    times_s: Mapping[str, float]
    """Seconds per iteration by schedule, in the order listed (``optimal``, DDP's, first)."""
    not_priced: Mapping[str, str] = field(default_factory=dict)
    """Why a schedule has no time, by name (FSDP2 without its costs)."""

    def __post_init__(self) -> None:
        if DDP not in self.times_s:
            raise ValueError("a verdict needs DDP's time (the schedule 'optimal')")
        for name, t in self.times_s.items():
            if not (math.isfinite(t) and t >= 0):
                raise ValueError(f"{name}: an iteration time must be a finite number >= 0, got {t!r}")
        object.__setattr__(self, "times_s", dict(self.times_s))
        object.__setattr__(self, "not_priced", dict(self.not_priced))

    def _tie(self) -> float:
        best = min(self.times_s.values())
        return best + TIE_REL * best

    def ranked(self) -> list[tuple[str, float]]:
        """``(name, t_iter_s)``, fastest first; those tied with the fastest in the order listed."""
        order, tie = list(self.times_s), self._tie()
        return sorted(self.times_s.items(), key=lambda kv: (kv[1] > tie, kv[1] if kv[1] > tie else 0.0,
                                                            order.index(kv[0])))  # fmt: skip

    @property
    def fastest(self) -> str:
        return self.ranked()[0][0]

    @property
    def tied(self) -> list[str]:
        """The schedules besides :attr:`fastest` within :data:`TIE_REL` of it."""
        tie = self._tie()
        return [n for n, t in self.ranked()[1:] if t <= tie]

    def ratio(self, name: str) -> float:
        """``name``'s time over DDP's (``inf`` where DDP's is 0 and ``name``'s is not)."""
        t, base = self.times_s[name], self.times_s[DDP]
        return t / base if base > 0 else (1.0 if t == 0 else math.inf)

    def text(self) -> str:
        """One line: the fastest, its time against DDP's, the others as ratios to DDP's, and what was not
        priced (module docstring)."""
        name, t = self.ranked()[0]
        tied = self.tied
        head = f"fastest in the model: {_LABELS.get(name, name)}"
        if tied:
            head += f", {', '.join(_LABELS.get(n, n) for n in tied)} within {TIE_REL:.1%}"
        base = self.times_s[DDP]
        if name == DDP:
            head += f" ({_ms(t)} ms)"
        else:
            head += (
                f", {self.ratio(name):.2f}x of DDP with the optimal plan ({_ms(t)} against {_ms(base)} ms)"
            )
        rest = [
            f"{_LABELS.get(n, n)} {self.ratio(n):.2f}x" for n, _ in self.ranked()[1 + len(tied) :] if n != DDP
        ]
        rest += [f"{n}: not priced ({why})" for n, why in self.not_priced.items()]
        return "; ".join([head, ", ".join(rest)] if rest else [head])

    def to_dict(self) -> dict[str, Any]:
        """JSON: the times, the fastest, the ties, what was not priced and the line."""
        return {
            "times_s": dict(self.times_s),
            "fastest": self.fastest,
            "tied": self.tied,
            "not_priced": dict(self.not_priced),
            "text": self.text(),
        }


def verdict(
    trace: Trace,
    cost: CommCost,
    nodes: int,
    *,
    update_s: float = 0.0,
    fsdp: float | str | None = None,
    fsdp_name: str = FSDP2,
    known: Mapping[str, float] | None = None,
) -> Verdict:
    """DDP's ``optimal`` plan and ``dear``'s, each planned for the all-reduce ``cost`` on ``nodes`` nodes
    and timed by :func:`dpcomm.sim.simulate`, beside ``fsdp``: FSDP2's seconds, or why it has none (a
    string; ``None``: not listed). ``known``: times already simulated alike (``{"dear": t}``), not
    planned again (DeAR's exact program takes seconds on a hundred layers)."""
    from dpcomm.planner import make_plan
    from dpcomm.sim.simulator import simulate

    times = {}
    for name in (DDP, DEAR):
        if known is not None and name in known:
            times[name] = float(known[name])
        else:
            plan = make_plan(name, trace, cost, nodes)
            times[name] = simulate(trace, plan, cost, nodes, update_s=update_s).t_iter_s
    why = {}
    if isinstance(fsdp, str):
        why[fsdp_name] = fsdp
    elif fsdp is not None:
        times[fsdp_name] = float(fsdp)
    return Verdict(times_s=times, not_priced=why)


def fastest(trace: Trace, cost: CommCost, nodes: int, **kw: Any) -> list[tuple[str, float]]:
    """``(name, t_iter_s)`` fastest first (:meth:`Verdict.ranked` of :func:`verdict`, whose keywords it
    takes)."""
    return verdict(trace, cost, nodes, **kw).ranked()


def _param_atoms(trace: Trace) -> list[tuple[int, int]] | None:
    """Runs of layers one ``fully_shard`` call takes whole, from the modules their parameters belong to
    (:func:`dpcomm.planner.fsdp_atoms.holder_atoms`); None where a layer names none."""
    from dpcomm.planner.fsdp_atoms import holder_atoms

    if not trace.layers or not all(x.param_names for x in trace.layers):
        return None
    return holder_atoms(
        [list(dict.fromkeys(n.rpartition(".")[0] for n in x.param_names)) for x in trace.layers]
    )


def fsdp_time_s(
    trace: Trace,
    ag: CommCost,
    rs: CommCost,
    nodes: int,
    *,
    memory: float | None = None,
    update_s: float = 0.0,
    overlap: str = "streams",
    unit_s: float = 0.0,
    atoms: Sequence[tuple[int, int]] | None = None,
    gap: float = GAP,
) -> float:
    """The modelled iteration of FSDP2's ``optimal`` plan (:func:`dpcomm.planner.fsdp.plan_fsdp`: units,
    prefetch depth and ``reshard_after_forward`` the fastest under ``memory``, within ``gap`` of the
    optimum) for all-gather and reduce-scatter costs of a unit's full bytes on ``nodes`` ranks (one rank:
    free). A budget nothing fits is a :class:`UserError`."""
    from dpcomm.planner.fsdp import plan_fsdp

    if nodes == 1:
        ag = rs = LinearCost(0.0, 0.0)
    plan = plan_fsdp("optimal", trace, ag, rs, memory=memory, update_s=update_s, overlap=overlap,
                     unit_s=unit_s, atoms=atoms, gap=gap)  # fmt: skip
    return float(plan.time_s)


def _timed(trace: Trace) -> bool:
    """Whether the trace has times (a sizes-only one, for planners that need none, has not)."""
    return any(x.forward_s > 0 or x.backward_s > 0 for x in trace.layers)


def for_allreduce(trace: Trace, cost: CommCost, nodes: int, *, device: str = "cpu") -> Verdict | None:
    """``dpcomm.ddp.wrap``'s verdict: its trace and all-reduce cost, FSDP2 planned with each of its
    collectives half of that cost (:func:`dpcomm.planner.dear.rs_ag_costs`) under no budget, with FSDP2's
    overlap and fixed cost per unit on ``device`` (a device type: ``cpu`` gathers asynchronously and
    blocks on reduce-scatters, :mod:`dpcomm.planner.fsdp_unit`). None for a trace without times."""
    from dpcomm.planner.dear import rs_ag_costs
    from dpcomm.planner.fsdp_unit import unit_s_for

    if not _timed(trace):
        return None
    rs, ag = rs_ag_costs(cost)
    overlap = "gathers" if device in ("cpu", "meta") else "streams"
    try:
        fsdp: float | str = fsdp_time_s(trace, ag, rs, nodes, overlap=overlap, unit_s=unit_s_for(device),
                                        atoms=_param_atoms(trace))  # fmt: skip
    except UserError as exc:
        fsdp = str(exc)
    return verdict(trace, cost, nodes, fsdp=fsdp)


def for_fsdp(
    trace: Trace, ag: CommCost, rs: CommCost, nodes: int, fsdp_s: float, *, fsdp_name: str = FSDP2
) -> Verdict | None:
    """``dpcomm.fsdp.shard``'s verdict: FSDP2's modelled ``fsdp_s`` beside DDP, whose all-reduce is ``ag +
    rs`` (both :class:`LinearCost`; else None), and DeAR, whose halves are ``rs`` and ``ag`` themselves
    (:class:`dpcomm.planner.dear.SplitCost`), on the same trace. Layers of frozen parameters
    (``extra["frozen"]``) hold no gradient: DDP and DeAR move none of their bytes. None for a trace without
    times."""
    from dpcomm.planner.dear import SplitCost

    if not (_timed(trace) and isinstance(ag, LinearCost) and isinstance(rs, LinearCost)):
        return None
    layers = tuple(replace(x, params=0) if x.extra.get("frozen") else x for x in trace.layers)
    cost = SplitCost(LinearCost(ag.a + rs.a, ag.b + rs.b), rs, ag)
    return verdict(replace(trace, layers=layers), cost, nodes, fsdp=fsdp_s, fsdp_name=fsdp_name)
