"""What ``dpcomm plan`` prints under a plan: the limits of the all-reduce and DeAR schedules
(:func:`dpcomm.planner.dear.limits`) and which of DDP with the ``optimal`` plan, ``dear`` and FSDP2 is
fastest in the model (:mod:`dpcomm.sim.verdict`).

FSDP2 is priced as ``dpcomm simulate``'s ``fsdp:optimal`` row is (:func:`dpcomm.sim.fsdp.plan_row` on the
costs of :func:`dpcomm.cli._costargs.fsdp_costs_of`, over the runs of layers one ``fully_shard`` call takes
whole), within :data:`dpcomm.sim.verdict.GAP` of its optimum (or ``--gap``, if larger: a plan printed
whatever the schedule should not wait minutes for a certificate), so the verdict's numbers are
``simulate --gap 0.05``'s; ``--linear-cost`` gives no all-gather or reduce-scatter cost, and FSDP2 is then
not priced (the line says why).
"""

from __future__ import annotations

import argparse

from dpcomm.costmodel.base import CommCost
from dpcomm.errors import UserError
from dpcomm.trace.format import Trace

__all__ = ["limits_text", "plain_fsdp"]


def _ms(t: float) -> str:
    return f"{t * 1e3:.2f}"


def limits_text(
    trace: Trace, cost: CommCost, nodes: int, update_s: float = 0.0, dear_first: bool = False
) -> str:
    """One line: the least ``t_iter`` of every all-reduce plan, ``F + max(B, C)``, and of every DeAR plan,
    ``max(F, AG) + max(B, RS)`` (plus the update), with their terms in ms (``dear_first``: DeAR's first)."""
    from dpcomm.planner.dear import limits, rs_ag_costs

    total = float(sum(trace.layer_bytes(i) for i in range(trace.num_layers)))
    rs, ag = rs_ag_costs(cost)
    c, a, r = (cost(total), ag(total), rs(total)) if nodes > 1 else (0.0, 0.0, 0.0)
    f, b = trace.t_f, trace.t_b
    lim = limits(trace, cost, nodes, update_s)
    u = f" + update {_ms(update_s)}" if update_s else ""
    ar = (
        f"all-reduce plans F + max(B, C) = {_ms(f)} + max({_ms(b)}, {_ms(c)}){u} = {_ms(lim['allreduce'])} ms"
    )
    de = (f"dear max(F, AG) + max(B, RS) = max({_ms(f)}, {_ms(a)}) + max({_ms(b)}, {_ms(r)}){u} = "
          f"{_ms(lim['dear'])} ms")  # fmt: skip
    first, second = (de, ar) if dear_first else (ar, de)
    why = "no plan of a schedule beats its own; C, AG, RS: the whole model in one message"
    return f"limits ({why}): {first}; {second}"


def plain_fsdp(args: argparse.Namespace, trace: Trace, world: int, model) -> float | str:
    """FSDP2's ``t_iter`` (``simulate``'s ``fsdp:optimal`` row at ``world`` ranks within
    :data:`~dpcomm.sim.verdict.GAP`, ``model`` the flow model of ``--topology`` or None), or why it has
    none."""
    from dpcomm.cli._costargs import fsdp_costs_of, fsdp_options
    from dpcomm.cli._fsdp_atoms import planned_on
    from dpcomm.sim.fsdp import plan_row
    from dpcomm.sim.verdict import GAP

    if args.linear_cost:
        return "--linear-cost prices no all-gather or reduce-scatter: give --network or --topology"
    try:
        costs_for, shards_for = fsdp_costs_of(args, model)
        on = planned_on(trace)[0]  # as plan --fsdp and simulate: no unit splits a fully_shard call's module
        opts = fsdp_options(args)
        opts["gap"] = max(opts["gap"], GAP)
        row = plan_row("fsdp:optimal", on, costs_for(world), world, shards=shards_for(world), **opts)
    except UserError as exc:
        return str(exc)
    return row.t_iter_s
