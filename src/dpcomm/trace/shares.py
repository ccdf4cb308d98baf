"""A measured trace's units as shares of a pass, the pass as long as a hookless iteration.

:mod:`dpcomm.trace.profiler` times every unit with hooks and marks inside the iteration, and times the
iteration again without them (``iteration_forward_s``, ``iteration_backward_s``). Where the device waits for
the host (a launch-bound GPU iteration), the hooks' host time stretches the hooked iteration: on an H200 in
bf16 the units' sums ran 1.12-1.60x the hookless iteration (docs/gpu.md). :func:`to_iteration` keeps each
unit's share of its pass (forward, backward) and scales the pass to the hookless time, so the units add up
to the iteration that training runs (MG-WFBP Eq. 3: t_f = sum_l t_f^(l), t_b = sum_l t_b^(l));
:func:`sum_ratios` is the check. docs/traces.md argues the choice.
"""

from __future__ import annotations

import dataclasses

from dpcomm.trace.format import Trace

__all__ = ["SCALED", "TOLERANCE", "sum_ratios", "to_iteration"]

SCALED = "hooked shares scaled to the hookless iteration (dpcomm.trace.shares.to_iteration)"
"""The ``attribution`` a trace scaled by :func:`to_iteration` records."""
TOLERANCE = 0.03
"""How far a measured trace's per-pass sums may be from its iteration fields (relative)."""


def sum_ratios(trace: Trace) -> tuple[float, float] | None:
    """``(sum of forward_s / iteration_forward_s, sum of backward_s / iteration_backward_s)``, or None for
    a trace without the iteration fields (analytic, re-timed)."""
    f, b = trace.extra.get("iteration_forward_s"), trace.extra.get("iteration_backward_s")
    if not f or not b:
        return None
    return trace.t_f / float(f), trace.t_b / float(b)


def to_iteration(trace: Trace) -> Trace:
    """``trace`` with each pass's unit times scaled to add up to its hookless iteration
    (``iteration_forward_s``, ``iteration_backward_s``): each unit keeps its share of the pass as the hooked
    iterations measured it, the pass takes the time it takes without hooks. The hooked sums before scaling
    are kept as ``hooked_forward_s``/``hooked_backward_s``. A trace without the two fields (analytic), one
    from ``torch.profiler`` (whose fields are its own sums) or one already scaled is returned as it is."""
    extra = dict(trace.extra)
    if sum_ratios(trace) is None or extra.get("measured_by") == "torch.profiler" or extra.get("attribution"):
        return trace
    sums = (sum(x.forward_s for x in trace.layers), sum(x.backward_s for x in trace.layers))
    want = (float(extra["iteration_forward_s"]), float(extra["iteration_backward_s"]))
    k = [w / h if h > 0 else 1.0 for w, h in zip(want, sums, strict=True)]
    extra.setdefault("hooked_forward_s", sums[0])
    extra.setdefault("hooked_backward_s", sums[1])
    extra["attribution"] = SCALED
    layers = tuple(
        dataclasses.replace(x, forward_s=x.forward_s * k[0], backward_s=x.backward_s * k[1])
        for x in trace.layers
    )
    return dataclasses.replace(trace, layers=layers, extra=extra)
