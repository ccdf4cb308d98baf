"""The testbed benchmarks' own runs, once each, small: a benchmark whose worker breaks would otherwise go
unnoticed until someone measures with it (``ibatch_testbed.py`` failed at the end of every run for a day).
Marked ``testbed``: they build an emulated cluster (root, iproute2). Budget: ~30 s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpcomm.planner.pull import CONFIRM_REL
from tests.test_testbed import _SKIP

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.testbed
@pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")
def test_ibatch_testbed_writes_every_method_with_its_model(tmp_path, monkeypatch):
    # two co-located workers, ResNet-20 at batch 8, two iterations per method: every pull method and the
    # all-reduce come back, each with its plan, both workers' medians and the model's F_N
    monkeypatch.setenv("DPCOMM_TESTBED_DIR", str(tmp_path / "state"))
    out = tmp_path / "r.json"
    argv = [sys.executable, str(ROOT / "benchmarks/ibatch_testbed.py"), "--topology", "star:2",
            "--rate", "500mbit", "--model", "resnet20", "--batch", "8", "--iters", "3", "--rounds", "1",
            "--probe-rounds", "2", "--timeout", "240", "--json", str(out)]  # fmt: skip
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    r = json.loads(out.read_text())
    assert set(r["methods"]) == {"all", "layer", "ibatch", "optimal"} and r["allreduce"]["t_iter_s"] > 0
    L = len(r["C_s"])
    for m in r["methods"].values():
        covered = [i for a, b in m["batches"] for i in range(a, b + 1)]
        assert covered == list(range(L))
        assert set(m["per_rank"]) == {"0", "1"} and m["fn_s"] > 0 and m["predicted_fn_s"] > 0
    assert r["methods"]["layer"]["batches"] == [[i, i] for i in range(L)]
    assert 0 < r["cpu_busy"] <= 1 and r["probe"] == "confirm"
    for p in r["probes"].values():  # a probed plan: its F_N and the model's; kept or not, as the rule says
        if p["probe_s"] is not None:
            assert p["confirmed"] == (p["probe_s"] <= (1 + CONFIRM_REL) * p["probe_model_s"])


def test_paper_reproductions_parse_and_price_the_lp_modes(monkeypatch):
    # the two paper reproductions on the testbed import, and their closed forms hold on a two-layer trace:
    # lp-alg2 = compute + reduce + broadcast, lp-alg3 = compute + allreduce + broadcast / 5, and lp-alg1 is
    # at least the compute and at most the fork-and-join of its layer-wise collectives
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import reproduce_lp_table2 as lp
    import reproduce_mgwfbp_testbed  # noqa: F401
    from dpcomm.costmodel.collective import collective_cost
    from dpcomm.costmodel.network import PRESETS
    from dpcomm.testbed import node
    from dpcomm.trace.format import Layer, Trace
    from dpcomm.train import replica

    assert node.parse_bsp("bsp:lp-alg2:mst:single") == ("lp-alg2", "mst", "single")
    assert node.BSP_KIND not in replica._KINDS  # importing the node program registers nothing
    net = PRESETS["10gbe"]
    layers = (Layer(name="a", params=1000, forward_s=0.01, backward_s=0.02),
              Layer(name="b", params=250_000, forward_s=0.03, backward_s=0.04))  # fmt: skip
    tr = Trace(model="t", batch_size=1, device="x", dtype_bytes=4, layers=layers)
    c = lambda op, n: collective_cost(op, "lp", n, lp.NODES, net)  # noqa: E731
    S = 4 * 251_000
    assert lp.predict_mode(tr, "lp-alg2", "lp", net) == pytest.approx(
        0.1 + c("reduce", S) + c("broadcast", S)
    )
    assert lp.predict_mode(tr, "lp-alg3", "lp", net) == pytest.approx(
        0.1 + c("allreduce", S) + c("broadcast", S) / 5
    )
    alg1 = lp.predict_mode(tr, "lp-alg1", "lp", net)
    per_layer = sum(c("reduce", 4 * l.params) + c("broadcast", 4 * l.params) for l in layers)
    assert 0.1 <= alg1 <= 0.1 + per_layer + 1e-12
