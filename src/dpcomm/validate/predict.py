"""The two predictions of a measured case, from the run's own records: the closed form and the flow model.

Both replay each schedule's iteration in dpcomm's simulators on the layer times its run profiled (the
trace: the runtime's, DDP-with-a-plan's and FSDP's own; plain DDP and the parameter server, which time no
layers, take the one ``optimal``, else any runtime schedule, profiled), with the plan it ran (the *kept*
plan: ``mgwfbp``/``optimal`` may keep ``single`` or DDP's buckets after their timed trial) and its measured
median optimizer time. They differ only in what a message costs:

(a) **closed form**: ``T(M) = a + b M``, one line fitted to the median per size of every runtime
    schedule's profiled all-reduces (:func:`dpcomm.demo_report.pooled_cost`); FSDP's all-gather and
    reduce-scatter lines are the ones its own run fitted; the parameter server's ``alpha`` and ``beta``
    are read off the same all-reduce line (ring: ``a = 2(P-1) alpha``, ``b = 2(P-1)/P beta``).
(b) **flow model** (:mod:`dpcomm.sim.network`): the same start-up ``a``, and for the bytes the
    collective's own flows on the testbed's topology and rate, max-min shared, with TCP/IP's headers and
    ACKs (no fitted bandwidth): ``T(M) = a + t_flow(M)``; FSDP's all-gather and reduce-scatter are each
    half a ring all-reduce's flows, the parameter server's ``beta`` its push-and-pull flows' time per byte.

Compute is the run's own, measured in its steady iterations: each trace's layer times are scaled so that
their sums are the schedule's median forward and backward (:func:`dpcomm.train.report.predict` with
``steady_compute=True``; the profiled iterations ran earlier, often under another load), the parameter
server's forward less its waits for pulls, and FSDP, whose forward and backward hold its collectives, the
median of the case's other schedules. What is left is the communication model's and the overlap's.

Iteration models: MG-WFBP Eq. 6-8 (:func:`dpcomm.sim.simulate`) for the runtime, DDP and ``lp-alg3`` (its
fork-join: every group after backward, one after another); the iBatch model (:func:`dpcomm.sim.ps.
simulate_ps`, co-located) plus the server's measured update for the parameter server; the FSDP planner's
event equations (:func:`dpcomm.planner.fsdp_model.fsdp_time`). Nothing is fitted to iteration times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

__all__ = ["Prediction", "error", "predict_case"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """One schedule of one case: measured and both predictions, seconds."""

    case: str
    schedule: str
    kept: str
    """The plan the run kept (``mgwfbp`` may keep ``single``), or the schedule."""
    measured_s: float
    exposed_s: float
    """Measured exposed communication (median)."""
    closed_s: float | None
    flow_s: float | None
    note: str = ""

    @property
    def err_closed(self) -> float | None:
        return error(self.closed_s, self.measured_s)

    @property
    def err_flow(self) -> float | None:
        return error(self.flow_s, self.measured_s)

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case, "schedule": self.schedule, "kept": self.kept,
                "measured_s": self.measured_s, "exposed_s": self.exposed_s, "closed_s": self.closed_s,
                "flow_s": self.flow_s, "err_closed": self.err_closed, "err_flow": self.err_flow,
                "note": self.note}  # fmt: skip


def error(predicted: float | None, measured: float) -> float | None:
    """``predicted / measured - 1`` (None without a prediction)."""
    if predicted is None or not measured > 0 or not math.isfinite(predicted):
        return None
    return predicted / measured - 1.0


class _FlowCost:
    """``T(M) = a + t_flow(M)``: the fitted start-up plus the flow model's time of the bytes (``share``
    of the collective's flows: 1, or 1/2 for an all-gather or reduce-scatter as half a ring)."""

    def __init__(self, flow: Any, a: float, share: float = 1.0):
        self.flow, self.a, self.share = flow, a, share

    def __call__(self, nbytes: float) -> float:
        return 0.0 if nbytes <= 0 else self.a + self.share * self.flow(nbytes)


def _line(a: float, b: float) -> Any:
    from dpcomm.costmodel.base import LinearCost

    return LinearCost(a, b)


def _kind(schedule: str) -> str:
    name = schedule.strip().partition(":")[0]
    return name if name in ("ddp", "ps", "fsdp") else "runtime"


def _ref_trace(case: dict[str, Any], results: list[dict[str, Any]]) -> Any:
    """The layer times a schedule that profiles none is priced on (see the module docstring)."""
    from dpcomm.trace.format import trace_from_dict
    from dpcomm.trace.shipped import find_trace

    for pick in ("optimal", None):
        for r in results:
            if r.get("trace") and _kind(r["schedule"]) == "runtime" and pick in (None, r["schedule"]):
                return trace_from_dict(r["trace"])
    return find_trace(case["trace"])  # the emulated model sleeps this trace's times


class _Models:
    """Everything one case's predictions share: the fitted line, the flow model, the reference trace."""

    def __init__(self, case: dict[str, Any], results: list[dict[str, Any]]):
        from dpcomm.demo_report import pooled_cost
        from dpcomm.sim.network import FlowModel, make_fabric
        from dpcomm.sim.network.pricing import FlowCost
        from dpcomm.testbed import parse_rate

        self.case, self.results = case, results
        self.P = next((r["nproc"] for r in results), 1)
        self.line = pooled_cost([SimpleNamespace(cost=r.get("cost")) for r in results])
        if self.line is None:  # no runtime schedule: DDP-with-a-plan's own fit
            own = next((r["cost"] for r in results if (r.get("cost") or {}).get("a") is not None), None)
            self.line = _line(own["a"], own["b"]) if own else None
        self.trace = _ref_trace(case, results)
        self.probed = [r["cost"] for r in results if (r.get("cost") or {}).get("Ts_s") is not None]
        fabric = make_fabric(case["topology"], parse_rate(case["rate"]))
        model = FlowModel(fabric, alpha_s=0.0)  # the start-up is the fitted a
        algo = "ring" if case["collective"] == "native" else case["collective"]
        self.flow = FlowCost(model=model, algo=algo, ranks=self.P)
        self.ring = FlowCost(model=model, algo="ring", ranks=self.P)
        self.ps = FlowCost(model=model, algo="ps", ranks=self.P)

    def costs(self) -> dict[str, Any]:
        """``{"closed": CommCost, "flow": CommCost}`` of one all-reduce."""
        if self.line is None:
            return {}
        return {"closed": self.line, "flow": _FlowCost(self.flow, self.line.a)}

    def net(self, how: str) -> Any:
        """The parameter server's alpha and beta (module docstring)."""
        import statistics

        from dpcomm.costmodel import Network

        P = self.P
        probed = self.probed
        if probed:  # the PS's own probe: Ts = (W-1) alpha per pull round, beta per byte on the wire
            alpha = statistics.median(c["Ts_s"] for c in probed) / max(1, P - 1)
            beta = statistics.median(c["beta_s_per_byte"] for c in probed)
        else:
            alpha, beta = self.line.a / (2 * (P - 1)), self.line.b * P / (2 * (P - 1))
        if how == "flow":
            m = 8 << 20
            beta = self.ps(m) / (2 * (P - 1) / P * m)
        return Network(name=f"validate {how}", alpha=alpha, beta=beta, gamma=0.0)


def _runtime(m: _Models, r: dict[str, Any], cost: Any, trace: Any, plan: Any) -> float:
    from dpcomm.sim import simulate

    trace = _scaled(trace, r["forward_s"], r["backward_s"])  # the run's steady compute (module docstring)

    if m.case["mode"] == "lp-alg3":  # fork-join: every group after backward, one after another
        t_c = sum(cost(sum(trace.layers[l].params for l in g) * trace.dtype_bytes) for g in plan.groups)
        t_fb = sum(layer.forward_s + layer.backward_s for layer in trace.layers)
        return t_fb + t_c + r["update_s"]
    return simulate(trace, plan, cost, r["nproc"], update_s=r["update_s"]).t_iter_s


def _ps(m: _Models, r: dict[str, Any], how: str) -> float:
    from dpcomm.planner import make_plan
    from dpcomm.planner.pull_model import PullPlan
    from dpcomm.ps.spec import parse_ps_schedule
    from dpcomm.sim.ps import PsCost, simulate_ps

    spec = parse_ps_schedule(r["schedule"])
    cost = PsCost(net=m.net(how), workers=r["nproc"], servers=spec.servers)
    trace = _scaled(m.trace, *_ps_compute(r))
    pulls = PullPlan(method=spec.pull, num_layers=trace.num_layers, batches=r["cost"]["pull_batches"])
    push = make_plan(str(spec.push), trace, cost, max(2, r["nproc"]))
    return simulate_ps(trace, pulls, push, cost).t_iter_s + r["update_s"]


def _ps_compute(r: dict[str, Any]) -> tuple[float, float]:
    """The PS worker's own steady forward (its measured forward less the time it waited for pulls) and
    backward (which holds its push hooks' CPU work) medians, seconds."""
    import statistics

    from dpcomm.train.report import steady

    kept = steady(r.get("records") or [])
    wait = statistics.median(x.get("pull_wait_s") or 0.0 for x in kept) if kept else 0.0
    return r["forward_s"] - wait, r["backward_s"]


def _scaled(trace: Any, t_f: float, t_b: float) -> Any:
    """``trace`` with its forward and backward layer times scaled to sum to ``t_f`` and ``t_b``."""
    from dataclasses import replace

    f = sum(layer.forward_s for layer in trace.layers) or 1.0
    b = sum(layer.backward_s for layer in trace.layers) or 1.0
    layers = tuple(replace(layer, forward_s=layer.forward_s * t_f / f, backward_s=layer.backward_s * t_b / b)
                   for layer in trace.layers)  # fmt: skip
    return replace(trace, layers=layers)


def _fsdp(m: _Models, r: dict[str, Any], how: str) -> float:
    import statistics

    from dpcomm.planner.fsdp_model import FsdpPlan, fsdp_time
    from dpcomm.trace.format import trace_from_dict

    # FSDP's forward and backward hold its collectives: the case's compute is the other schedules'
    others = [x for x in m.results if _kind(x["schedule"]) in ("runtime", "ddp")]
    trace = trace_from_dict(r["trace"])
    if others:
        t_f = statistics.median(x["forward_s"] for x in others)
        trace = _scaled(trace, t_f, statistics.median(x["backward_s"] for x in others))
    plan = FsdpPlan.from_dict(r["plan"])
    (aa, ab), (ra, rb) = r["cost"]["all_gather"], r["cost"]["reduce_scatter"]
    if how == "closed":
        ag, rs = _line(aa, ab), _line(ra, rb)
    else:
        # gloo's reduce_scatter moves an all-reduce's bytes (its fitted b is the ring all-reduce's, twice
        # the all-gather's): a whole ring all-reduce's flows; the all-gather, half of them
        ag, rs = _FlowCost(m.ring, aa, 0.5), _FlowCost(m.ring, ra, 1.0)
    f = [layer.forward_s for layer in trace.layers]
    b = [layer.backward_s for layer in trace.layers]
    bytes_ = [trace.layer_bytes(i) for i in range(trace.num_layers)]
    # on CPU dpcomm.fsdp.shard runs FSDP2 with asynchronous all-gathers and blocking reduce-scatters: the
    # model it plans with (overlap="gathers", dpcomm.planner.fsdp_model)
    return float(fsdp_time(plan.units, f, b, bytes_, ag, rs, depth=plan.depth, overlap="gathers",
                           reshard=plan.reshard_after_forward, update_s=r["update_s"]))  # fmt: skip


def _one(m: _Models, r: dict[str, Any], how: str) -> tuple[float | None, str]:
    """One prediction of one schedule, and why there is none."""
    from dpcomm.demo_sim import ddp_plan
    from dpcomm.plan import Plan
    from dpcomm.trace.format import trace_from_dict

    kind, costs = _kind(r["schedule"]), m.costs()
    if kind == "fsdp":
        if not r.get("cost") or not r.get("trace") or not r.get("plan"):
            return None, "no FSDP costs recorded"
        return _fsdp(m, r, how), ""
    if kind == "ps":
        if not (r.get("cost") or {}).get("pull_batches"):
            return None, "no pull plan recorded"
        if m.line is None and not m.probed:
            return None, "no pull or all-reduce was profiled"
        return _ps(m, r, how), ""
    if not costs:
        return None, "no all-reduce was profiled"
    cost = costs[how]
    if r["schedule"] == "ddp":
        return _runtime(m, r, cost, m.trace, ddp_plan(m.trace, cost, r["nproc"])), ""
    if not r.get("trace") or not r.get("plan"):
        return None, "no profiled trace or plan"
    return _runtime(m, r, cost, trace_from_dict(r["trace"]), Plan.from_dict(r["plan"])), ""


def predict_case(record: dict[str, Any]) -> list[Prediction]:
    """Both predictions for every schedule of one case's record (:func:`dpcomm.validate.run.run_case`)."""
    case, results = record["case"], record["results"]
    m = _Models(case, results)
    out = []
    for r in results:
        closed, why = _one(m, r, "closed")
        flow, _ = _one(m, r, "flow")
        closed, flow = (float(x) if x is not None else None for x in (closed, flow))  # numpy's -> JSON's
        kept = (r.get("plan") or {}).get("schedule") or r["schedule"]
        if _kind(r["schedule"]) != "runtime":
            kept = r["schedule"]
        out.append(Prediction(case=case["name"], schedule=r["schedule"], kept=str(kept),
                              measured_s=r["t_iter_s"], exposed_s=r["exposed_comm_s"], closed_s=closed,
                              flow_s=flow, note=why))  # fmt: skip
    return out
