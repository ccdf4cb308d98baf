"""A network file fitted on one server count of a cluster, priced on another (``fit_apply.scope``), and a tie
between NCCL's own choice and a forced algorithm (``fit.clearly_better``).

The cluster is the model itself with other values than the preset's (a synthetic ground truth): NVLink
moving 0.68 of its line rate (the preset says 370/450 = 0.82), the NICs 0.85 (0.96), NCCL's latency of a
bandwidth-bound call x1.5; its nccl-tests log on the fitted count perturbed by +-2% (a deterministic
ripple), its rows on the other counts exact. Apart from tests/test_calibrate.py so that the fast tier spreads
the fits (about 2 s on one server, 5 s on four) over its workers.
"""

from __future__ import annotations

import json
import math

import pytest

from dpcomm.cli.main import main
from dpcomm.costmodel import load_network
from tests._nccl_logs import SIZES
from tests._nccl_logs import model_rows as _model_rows
from tests._nccl_logs import nccl_tests_log as _nccl_tests_log

TRUTH = "hgx-h100:{m},intra_eff=0.68,nic_eff=0.85,lat_scale=1.5"


def _ripple(rows, amp=0.02):
    return [(n, t * (1 + amp * math.sin(3 * k))) for k, (n, t) in enumerate(rows)]


def _calibrate(tmp_path, rows, servers, extra=""):
    log = tmp_path / f"all_reduce_{servers}.log"
    log.write_text(_nccl_tests_log(rows, ranks=8 * servers, extra=extra))
    out = tmp_path / f"fit_{servers}.json"
    argv = ["calibrate", "--from-nccl-tests", str(log), "--topology", f"hgx-h100:{servers}", "-o", str(out)]
    with __import__("contextlib").redirect_stdout(__import__("io").StringIO()):
        assert main(argv) == 0
    return out


def _netsim(capsys, servers, network=None):
    argv = ["netsim", "--topology", f"hgx-h100:{servers}", "--sizes", ",".join(map(str, SIZES)), "--json"]
    assert main([*argv, *(["--network", str(network)] if network else [])]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """The cluster's files fitted on 1, 2 and 4 servers (its perturbed logs, NCCL's own choice)."""
    tmp = tmp_path_factory.mktemp("counts")
    rows = {m: _ripple(_model_rows(TRUTH.format(m=m), "nccl", None, SIZES)) for m in (1, 2, 4)}
    return {m: _calibrate(tmp, rows[m], m) for m in rows}


CASES = [(1, 2), (1, 4), (1, 8), (2, 1), (2, 8), (4, 1), (4, 2), (4, 8)]


@pytest.mark.parametrize(("fit_on", "price_on"), CASES)
def test_a_file_prices_other_server_counts_no_worse_than_none(fitted, capsys, fit_on, price_on):
    # before: the one-server fit chose nccl-tree by a hair (1.43% against NCCL's choice's 1.48% rms) and
    # wrote algo=tree, and its start-up per message (NVLink hops only), latency factor and per-size factors
    # went to every count (the 8-byte row 32-53% off on 2-8 servers, where no file is exact); the 4-server
    # fit's start-up did the same on 1, 2 and 8 servers. On 2 servers NVLSTree is not NIC-bound here: that
    # fit leaves the NICs as the preset has them
    truth = dict(_model_rows(TRUTH.format(m=price_on), "nccl", None, SIZES))
    with_file = _netsim(capsys, price_on, fitted[fit_on])
    without = _netsim(capsys, price_on)
    better = 0
    for f, n in zip(with_file, without, strict=True):
        t = truth[f["bytes"]]
        assert abs(f["time_s"] / t - 1) <= abs(n["time_s"] / t - 1) + 1e-9, (f["bytes"], f, n, t)
        better += abs(f["time_s"] / t - 1) < abs(n["time_s"] / t - 1) - 0.01
        assert f["algorithm"] == "nccl" and not f["ran"].endswith("row-fitted")
    fabric = load_network(fitted[fit_on]).fabric
    assert fabric["algo"] is None and fabric["algorithm"] == "nccl"  # NCCL's own choice kept (a tie)
    if (fit_on, price_on) not in ((4, 1), (4, 2)):  # what the fit measured helps (not where the NICs idle)
        assert better >= 1
    bound, idle = ("nic_eff", "intra_eff") if fit_on == 4 else ("intra_eff", "nic_eff")
    assert fabric["sensitivity"][bound] > 0.8 and fabric["need"][bound] > 0.005  # what bound the rows
    assert fabric["sensitivity"][idle] < 0.05  # and what did not


def test_a_log_forcing_nvls_on_one_server_leaves_nccls_choice_on_several(tmp_path, capsys):
    # before: the file said algo=nvls and netsim refused 2 servers ("nccl-nvls needs NVLink SHARP on one
    # server"); NVLS does not run across servers, so NCCL_ALGO=NVLS there leaves NCCL's own choice
    rows = _model_rows(TRUTH.format(m=1), "nccl-nvls", None, SIZES)
    path = _calibrate(tmp_path, rows, 1, extra="NCCL_ALGO=NVLS")
    fabric = load_network(path).fabric
    assert fabric["algo"] == "nvls" and fabric["forced"]["algo"] == "nvls"
    assert all(r["algorithm"] == "nccl-nvls" for r in _netsim(capsys, 1, path) if r["bytes"] >= 64 << 20)
    got, none = _netsim(capsys, 2, path), _netsim(capsys, 2)
    assert [r["algorithm"] for r in got] == ["nccl"] * len(SIZES)
    assert [r["ran"].split(" ")[0] for r in got] == [r["ran"].split(" ")[0] for r in none]


@pytest.mark.parametrize(("ring_share", "kept"), [(0.55, "nccl"), (0.65, "nccl-tree")])
def test_a_tie_keeps_nccls_own_choice(ring_share, kept):
    # a table between NCCL's own choice (NVLS at 64 MiB and up on one H100 server) and the ring (its times'
    # geometric mean, the ring's weight ring_share): with 0.55 the tree, forced, fits it to 0.31% rms and
    # NCCL's choice to 0.54%, within nccl-tests' spread; before, the least error won by that and the file
    # said algo=tree. Now a forced algorithm must be clearly better (fit.clearly_better), so the file forces
    # none; with 0.65 (0.23% against 0.99%) the tree is clearly better and is kept
    from dpcomm.sim.network.fit import TIE_RMS, clearly_better, fit_nccl_tests
    from dpcomm.sim.network.nccl_tests import parse_nccl_tests

    spec, w = "hgx-h100:1,intra_eff=0.68", ring_share
    own, ring = (_model_rows(spec, a, None, SIZES) for a in ("nccl", "nccl-ring"))
    mixed = [
        (n, math.exp((1 - w) * math.log(a) + w * math.log(b)))
        for (n, a), (_, b) in zip(own, ring, strict=True)
    ]
    fit = fit_nccl_tests(parse_nccl_tests(_nccl_tests_log(mixed, ranks=8)), "hgx-h100:1")
    best = min(fit.tried, key=fit.tried.get)
    assert best != "nccl", fit.tried  # the old rule's pick: a forced algorithm, by the least error
    assert fit.algorithm == kept and fit.to_dict()["algo"] == (None if kept == "nccl" else "tree")
    if kept == "nccl":  # within the tie, and no algo= written
        assert fit.tried["nccl"] - TIE_RMS < fit.tried[best] and "algo=" not in fit.topology.spec
    # the rule itself: lower by 0.5 percentage points of rms and by a tenth of NCCL's choice's, both
    assert not clearly_better(0.021**2, 0.021**2, 1) and not clearly_better(0.020**2, 0.024**2, 1)
    assert not clearly_better(0.094**2, 0.100**2, 1) and clearly_better(0.010**2, 0.020**2, 1)


@pytest.mark.parametrize(
    ("field", "words"),
    [
        (
            {"sensitivity": {"nic_eff": "lots"}},
            "field 'fabric.sensitivity' must map fitted values to numbers",
        ),
        ({"need": [0.1]}, "field 'fabric.need' must map fitted values to numbers"),
        ({"forced": "ring"}, "field 'fabric.forced' must be {algo, proto}"),
    ],
)
def test_a_malformed_scope_is_one_line(tmp_path, capsys, field, words):
    from dpcomm.costmodel.network import Network, save_network

    fabric = {"topology": "hgx-h100:2", "nic_eff": 0.9, "intra_eff": 0.8, "alpha_s": None, **field}
    path = save_network(Network(name="n", alpha=1e-6, beta=1e-10, fabric=fabric), tmp_path / "n.json")
    argv = ["netsim", "--topology", "hgx-h100:4", "--sizes", "1M", "--network", str(path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpcomm: error: ") and words in err and err.count("\n") == 1, err
