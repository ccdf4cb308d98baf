"""Online re-planning: when a running job switches to a new plan, and at which iteration.

A network whose rate changes under a running job (another job's traffic, a link renegotiated) moves the
all-reduce cost ``T(M) = a + b*M`` (MG-WFBP Eq. 9) and with it the best merge of layers. Every ``K`` steady
iterations (``--replan-every K``), :class:`~dpcomm.train.online.OnlinePlanner` measures again exactly as for
the first plan (``profile_iters`` iterations of the safe ``single`` plan with every layer timed, then the
all-reduce at a few sizes), the root makes a new plan, and the model (:func:`dpcomm.sim.simulate`, MG-WFBP
Eq. 6-8) prices the running plan and the new one on the *new* measurements. The job switches only when the
predicted gain is above :data:`REPLAN_GAIN` of the running plan's predicted ``t_iter``. ``ddp:PLANNER``
replicas (:mod:`dpcomm.train.ddp_plan_replica`) make the same decision and rebuild DDP's buckets on a switch.

Every rank must switch at the same iteration (a plan that differs between ranks pairs unrelated messages):
the re-plan points are a function of the steady-iteration count alone (:func:`replan_due`), the decision is
made on the root and broadcast with the plan, and the kept plan's hash is all-gathered and compared
(:func:`dpcomm.runtime.broadcast.check_same_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpcomm.costmodel.base import CommCost
from dpcomm.plan import Plan
from dpcomm.trace.format import Trace

__all__ = ["REPLAN_GAIN", "Decision", "decide", "predict_t_iter", "replan_due"]

REPLAN_GAIN = 0.15
"""Switch only when the new plan is predicted faster by more than this fraction of the running plan's
predicted ``t_iter``. Why 15%: the prediction is only as good as the measurements, and on a loaded CPU
machine the per-layer times move between two profiles of the same job: on the 2-core CPU VM's testbed
(``star:4`` at an unchanged 100 Mbit/s, ResNet-20, docs/ddp.md "Re-planning online") re-plans predicted
gains of 5.1%, 8.6% and 9.8% from that noise alone, while raising the rate from 10 to 100 Mbit/s predicts
well over 20%. A switch is not free either (new flat buffers; the new plan's first iteration is slower)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The outcome of one re-plan."""

    switch: bool
    """True: run ``new`` from the next iteration; False: keep the running plan."""
    current_s: float
    """The running plan's predicted ``t_iter`` on the new measurements, seconds."""
    new_s: float
    """The new plan's predicted ``t_iter``, seconds."""
    threshold: float
    """The gain needed, as a fraction of ``current_s``."""

    @property
    def gain(self) -> float:
        """Predicted gain as a fraction of ``current_s`` (negative: the new plan is predicted slower)."""
        return (self.current_s - self.new_s) / self.current_s if self.current_s > 0 else 0.0


def replan_due(steady_iters: int, every: int) -> bool:
    """Whether to re-plan after the ``steady_iters``-th steady iteration since the last plan was adopted
    (a pure function of counts every rank shares: every rank re-plans at the same iteration)."""
    return every > 0 and steady_iters > 0 and steady_iters % every == 0


def predict_t_iter(trace: Trace, plan: Plan, cost: CommCost, nodes: int) -> float:
    """The model's ``t_iter`` of ``plan`` (MG-WFBP Eq. 6-8 through :func:`dpcomm.sim.simulate`), seconds."""
    from dpcomm.sim.simulator import simulate

    return simulate(trace, plan, cost, nodes).t_iter_s


def decide(
    trace: Trace, current: Plan, new: Plan, cost: CommCost, nodes: int, threshold: float = REPLAN_GAIN
) -> Decision:
    """Price ``current`` and ``new`` on the same trace and cost; switch when the gain exceeds ``threshold``
    of the current plan's time (a new plan with the same groups never switches)."""
    cur = predict_t_iter(trace, current, cost, nodes)
    nxt = predict_t_iter(trace, new, cost, nodes)
    switch = new.groups != current.groups and cur - nxt > threshold * cur
    return Decision(switch=switch, current_s=cur, new_s=nxt, threshold=threshold)


def message(iteration: int, d: Decision, current: Plan, new: Plan, groups: Any) -> str:
    """The log line of a re-plan: ``re-plan at iteration i: switched ..., predicted X ms -> Y ms``."""
    what = (
        f"switched {current.schedule} {groups(current)} -> {new.schedule} {groups(new)}"
        if d.switch
        else f"kept {current.schedule} {groups(current)} (new plan {groups(new)})"
    )
    return (
        f"re-plan at iteration {iteration}: {what}, predicted {d.current_s * 1e3:.1f} ms -> "
        f"{d.new_s * 1e3:.1f} ms ({d.gain * 100:+.1f}%, threshold {d.threshold * 100:.0f}%)"
    )
