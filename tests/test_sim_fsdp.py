"""``dpcomm simulate``'s ``fsdp:optimal`` row on costs that are not straight lines (:mod:`dpcomm.sim.fsdp`).

The exact search plans on each cost's least-squares line, and the row is timed by the costs themselves; a
cost that bends (here a step: messages above 3 MB move a hundred times faster per byte, as a switch to a
bandwidth protocol would make them) can make the lines' optimum slower than ``per-block`` on the prices
(it was: 45.9 ms against 36.1 ms before ``optimal`` compared them). The row must
never report that: ``optimal`` keeps whichever of its own plan and the simple planners' (each at every
depth and reshard that fits) the prices time fastest.
"""

from __future__ import annotations

import pytest

from dpcomm.costmodel.base import LinearCost
from dpcomm.planner.fsdp import Modules, fsdp_time
from dpcomm.sim.fsdp import plan_row
from dpcomm.trace.format import Layer, Trace

STEP = 3_000_000  # bytes


class Step:
    """``10 us + 1 ns/B`` up to :data:`STEP` bytes, ``10 us + 10 ps/B`` above: no line fits it."""

    def __call__(self, nbytes: float) -> float:
        nbytes = float(nbytes)
        return 1e-5 + (1e-9 if nbytes <= STEP else 1e-11) * nbytes


def _trace() -> Trace:
    layers = [Layer(name=f"h.{i}.{part}", params=400_000, forward_s=1e-3, backward_s=2e-3)
              for i in range(6) for part in ("attn", "mlp")]  # fmt: skip
    return Trace(model="blocks", batch_size=1, device="synthetic", dtype_bytes=4, layers=tuple(layers))


def test_optimal_on_bent_costs_never_loses_to_per_block_on_the_prices():
    trace = _trace()
    costs = lambda G: (Step(), Step(), None)  # noqa: E731 - one cost per group size, as MeshCosts
    rows = {s: plan_row(s, trace, costs, 8) for s in ("fsdp:optimal", "fsdp:per-block", "fsdp:whole")}
    opt, block = rows["fsdp:optimal"], rows["fsdp:per-block"]
    assert opt.fit_error > 0.5  # the lines were far off: the case this guards
    assert opt.t_iter_s <= block.t_iter_s * (1 + 1e-12) and opt.t_iter_s <= rows["fsdp:whole"].t_iter_s
    f, b, m = Modules.from_trace(trace).arrays
    d, r = opt.plan.depth, opt.plan.reshard_after_forward
    priced = fsdp_time(opt.plan.units, f, b, m, Step(), Step(), depth=d, reshard=r)
    assert opt.t_iter_s == pytest.approx(priced)


def test_optimal_on_lines_is_the_planners_own_plan():
    trace = _trace()
    line = LinearCost(1e-5, 1e-10)
    opt = plan_row("fsdp:optimal", trace, lambda G: (line, line, None), 8)
    assert "priced_best" not in opt.plan.meta and opt.fit_error == 0.0
    assert opt.t_iter_s == pytest.approx(opt.plan.time_s, rel=1e-12)
