"""How a parameter-server run decides its pull plan, on every rank (the paper's planner is
:mod:`dpcomm.planner.pull`; the measurements are :mod:`dpcomm.ps.probe`'s).

1. ``all`` and ``layer`` need nothing measured.
2. ``ibatch``/``optimal``: every rank takes part in :meth:`Prober.measure`; rank 0 plans
   (:func:`dpcomm.planner.pull.plan_pulls`, with the placement's :func:`~dpcomm.planner.pull.ibatch_margin`),
   broadcasts the plan, and every rank checks its sha256.
3. The probe (``PsSpec.probe``), where that plan is neither ``all`` nor ``layer``: the workers time
   ``probe_rounds`` rounds of its pulls beside a forward that waits for each batch (:meth:`Prober.overlap`);
   ``confirm`` keeps the plan unless the median ran more than 10% slower than the model, else the better
   of ``all`` and ``layer`` (:func:`dpcomm.planner.pull.confirm_plan`); ``slowdown`` fits ``d`` to it
   (:func:`dpcomm.planner.pull.fit_slowdown`) and rank 0 plans again with it. That plan is broadcast and
   checked as in 2, its ``meta`` holding every input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from dpcomm.planner.pull import PullPlan, confirm_plan, fit_slowdown, ibatch_margin, plan_pulls
from dpcomm.ps.node import PsError
from dpcomm.ps.probe import Prober

if TYPE_CHECKING:
    from dpcomm.ps.rank import PsRank

__all__ = ["PullPlanning"]


class PullPlanning:
    """Decides this run's pull plan with the other ranks (module docstring)."""

    def __init__(self, ps: PsRank, log: Callable[[str], None]) -> None:
        self.spec, self.rank, self.group, self.layout = ps.spec, ps.rank, ps.group, ps.layout
        self.worker, self.log = ps.worker, log
        self.prober = Prober(ps)

    def plan(self, mods: list[nn.Module], sample: torch.Tensor | None) -> PullPlan:
        """The pull plan every rank runs (module docstring)."""
        L = len(mods)
        if self.spec.pull in ("all", "layer"):
            return plan_pulls([0.0] * L, [0.0] * L, 0.0, self.spec.pull)
        sample = sample if self.worker is not None else None
        got = self.prober.measure(mods, sample)
        C, Tt, Ts, beta, meta = got.C_s, got.Tt_s, got.Ts_s, got.beta_s_per_byte, got.meta()
        plan = self._agree(self._planned(C, Tt, Ts, 0.0, meta))
        # confirm: all and layer are what a refuted plan falls back to, so there is nothing to probe
        probed = {"none": False, "slowdown": True, "confirm": plan.messages not in (1, L)}[self.spec.probe]
        if probed and got.timed:
            # time that plan beside a forward, then keep it or not (confirm), or fit d and plan again
            overlap_s = self.prober.overlap(mods, sample, list(plan.batches))
            meta = {
                **meta,
                "overlap_batches": [list(b) for b in plan.batches],
                "overlap_forward_s": overlap_s,
                "time_d0_s": plan.time_s,
            }
            if self.spec.probe == "confirm":
                kept = confirm_plan(plan, C, Tt, Ts, overlap_s) if self.rank == 0 else None
                plan = self._agree(replace(kept, meta={**kept.meta, **meta}) if kept else None)
            else:
                # rank 0 plans with its own Tt (the bytes it pulls); the others get its d in the plan's meta
                d = fit_slowdown(plan.batches, C, Tt, Ts, overlap_s) if self.rank == 0 else 0.0
                plan = self._agree(self._planned(C, Tt, Ts, d, {**meta, "slowdown": d}))
        self.log(
            f"[rank {self.rank}] {self.spec.pull} pulls: {plan.messages} batch(es) {list(plan.batches)}, "
            f"Ts {Ts * 1e6:.0f} us, beta {beta * 1e9:.2f} ns/B, "
            f"slowdown {plan.meta.get('slowdown', 0.0):.2f}, model {plan.time_s * 1e3:.2f} ms"
            + (
                ""
                if plan.meta.get("confirmed", True)
                else f" (refuted by its probe: {plan.meta['refuted_batches']})"
            )
        )
        return plan

    def _planned(self, C: list[float], Tt: list[float], Ts: float, d: float, meta: dict) -> PullPlan | None:
        """Rank 0's plan of the spec's method with these inputs (its ``meta`` added); None elsewhere."""
        if self.rank != 0:
            return None
        margin = ibatch_margin(self.layout.workers, 0 if self.layout.colocated else self.layout.servers)
        plan = plan_pulls(C, Tt, Ts, self.spec.pull, slowdown=d, margin=margin)
        plan.meta.update(meta)
        return plan

    def _agree(self, plan: PullPlan | None) -> PullPlan:
        """Rank 0's ``plan`` on every rank, each checking its sha256."""
        box: list[Any] = [plan]
        dist.broadcast_object_list(
            box, src=dist.get_global_rank(self.group, 0) if self.group else 0, group=self.group
        )
        shas: list[Any] = [None] * self.layout.world
        dist.all_gather_object(shas, box[0].sha256(), group=self.group)
        if len(set(shas)) != 1:
            raise PsError(f"parameter server: ranks disagree on the pull plan: {shas}")
        return box[0]
