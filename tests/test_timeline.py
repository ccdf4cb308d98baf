"""One timeline (:mod:`dpcomm.timeline`): the same spans from the simulator and the runtime, one Chrome
writer (and its reader), one plotter. Budget: pure, about a second (matplotlib Agg)."""

import json

import pytest

from dpcomm.costmodel.base import LinearCost
from dpcomm.planner import make_plan
from dpcomm.sim import simulate
from dpcomm.sim.chrome import chrome_trace
from dpcomm.timeline import Span, read_chrome_spans, write_chrome_trace_file
from dpcomm.timeline.plot import Panel, measured_panels, plot_panels
from tests._sim_ref import make_trace

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _iteration(t: float, comm: float) -> list[Span]:
    return [
        Span(name="forward", row="compute", start=t, end=t + 0.010),
        Span(name="backward", row="compute", start=t + 0.010, end=t + 0.030),
        Span(name="allreduce 0", row="comm", start=t + 0.020, end=t + 0.020 + comm, args={"group": 0}),
        Span(name="step", row="compute", start=t + 0.030, end=t + 0.035),
    ]


def test_runtime_trace_round_trips_through_the_one_writer(tmp_path):
    spans = {r: _iteration(100.0, 0.004 * (r + 1)) for r in range(2)}
    path = write_chrome_trace_file(tmp_path / "t.json", spans)
    events = json.loads(path.read_text())["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M"}
    assert (0, "rank 0") in names and (1, "comm") in names and (1, "compute") in names
    for r in range(2):
        back = read_chrome_spans(path, r)
        assert [(s.name, s.row) for s in back] == [
            (s.name, s.row) for s in sorted(spans[r], key=lambda s: s.start)
        ]
        for got, want in zip(back, sorted(spans[r], key=lambda s: s.start), strict=True):
            assert got.start == pytest.approx(want.start) and got.end == pytest.approx(want.end)


def test_simulated_spans_are_the_chrome_events():
    trace = make_trace([1e-3, 2e-3, 3e-3], [2e-3, 4e-3, 6e-3], [1000, 2000, 3000])
    res = simulate(
        trace, make_plan("wfbp", trace, LinearCost(a=1e-4, b=1e-9), 4), LinearCost(a=1e-4, b=1e-9), 4
    )
    spans = res.spans()
    assert len(spans) == len(res.compute) + len(res.comm)
    assert {s.row for s in spans} == {"compute", "comm"} and {s.kind for s in spans} == {
        "forward",
        "backward",
        "comm",
    }
    x = [e for e in chrome_trace([res])["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["ts"], e["dur"]) for e in x] == [
        (s.name, s.start * 1e6, (s.end - s.start) * 1e6) for s in spans
    ]


def test_one_plotter_draws_simulated_and_measured_panels(tmp_path):
    trace_file = write_chrome_trace_file(
        tmp_path / "m.json", {0: _iteration(0.0, 0.01) + _iteration(0.05, 0.01)}
    )
    measured = measured_panels({"measured": trace_file}, iterations=1)
    assert measured[0].t0 == pytest.approx(0.05) and len(measured[0].spans) == 4  # the last iteration only
    trace = make_trace([1e-3, 2e-3], [2e-3, 4e-3], [1000, 2000])
    cost = LinearCost(a=1e-4, b=1e-9)
    res = simulate(trace, make_plan("single", trace, cost, 2), cost, 2)
    sim = Panel(title="simulated", spans=res.spans(), marker_s=res.t_iter_s)
    out = plot_panels([sim, *measured], tmp_path / "both.png")
    assert out.read_bytes().startswith(PNG_MAGIC)
    with pytest.raises(ValueError):
        plot_panels([], tmp_path / "none.png")
