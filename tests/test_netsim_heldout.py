"""The flow model against the published nccl-tests tables held out from it (docs/data/
netsim_multigpu_published.json, split before their errors were computed; docs/netsim.md): priced with the
model's defaults, nothing calibrated, as ``benchmarks/netsim_multigpu.py`` prints them. No processes; ~1 s."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def priced():
    """Every published row of 64 MiB and up, priced, and the per-table and per-split geomeans."""
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(ROOT / "benchmarks"))
    try:
        import json

        import netsim_multigpu as bench

        published = json.loads((ROOT / "docs/data/netsim_multigpu_published.json").read_text())
        rows = bench.validate(published)
        yield rows, bench.summary(rows), published
    finally:
        mp.undo()


def _set(published: dict, name: str) -> dict:
    """The published cases of held-out set ``name``, by name (the JSON's ``decided`` names the set)."""
    start = f"held-out set {name}:"
    return {c["name"]: c for c in published["cases"] if c.get("decided", "").startswith(start)}


def test_held_out_tables_meet_the_goal(priced):
    # issues 49 and 57's goal on all held-out tables together: geomean |error| at most 5%, no table beyond
    # 15%, and the median signed error within +-3% (the model not systematically fast: +4.5% on sets 2-7,
    # within the goal with held-out set 8)
    rows, summ, published = priced
    held = {c["name"] for c in published["cases"] if c["split"] == "held-out"}
    assert len(held) >= 15 and {r["case"] for r in rows if r["split"] == "held-out"} == held
    assert summ["splits"]["held-out"]["geomean_abs_error"] <= 0.05
    worst = max(held, key=summ["tables"].get)
    assert summ["tables"][worst] <= 0.15, worst
    assert abs(summ["splits"]["held-out"]["median_error"]) <= 0.03, summ["splits"]["held-out"]["median_error"]


def test_p4d_class_efa_table_with_a_recent_nccl_held_out_within_10pct(priced):
    # held-out set 5: 2 x p4de (A100, 4 x 100G EFA), the README's NCCL 2.20.3 and aws-ofi-nccl 1.8.1; every
    # row of 64 MiB and up within 10% of the published busbw, uncalibrated (26.9% off with EFA's fraction
    # stepping up only at NCCL 2.23)
    rows, summ, published = priced
    case = next(c for c in published["cases"] if c["name"] == "aws-p4de-2x8-efa-readme")
    assert case["split"] == "held-out" and case["topology"].startswith("p4de:")
    assert case["decided"].startswith("held-out set 5")
    mine = [r for r in rows if r["case"] == case["name"]]
    assert len(mine) == 6 and all("nccl=2.20.3" in r["topology"] for r in mine)
    assert max(abs(r["error"]) for r in mine) <= 0.10, [round(r["error"], 3) for r in mine]
    assert summ["splits"]["held-out set 5"]["geomean_abs_error"] <= 0.10


def test_held_out_set_6_p4d_tables_strictly_held_out(priced):
    # held-out set 6: two 2 x p4d tables (SkyPilot's README, busbw only), committed with their split and
    # versions before any error was computed (docs/netsim.md); the one run with no settings is within 10%
    # in every row of 64 MiB and up, the other (8 MiB buffers, 512 KiB chunks) within 10% by its geomean
    rows, summ, published = priced
    cases = _set(published, "6")
    assert set(cases) == {"skypilot-p4d-2x8-efa-vm", "skypilot-p4d-2x8-efa-hyperpod"}
    for name, case in cases.items():
        assert case["split"] == "held-out" and case["algorithm"] == "nccl"
        assert all("busbw_GBps" in r for r in case["rows"])  # as published: busbw, no times
        mine = [r for r in rows if r["case"] == name]
        assert len(mine) == 6 and all(r["topology"].startswith("p4d:2,") for r in mine)
        assert summ["tables"][name] <= 0.10, (name, summ["tables"][name])
    vm = [r["error"] for r in rows if r["case"] == "skypilot-p4d-2x8-efa-vm"]
    assert max(abs(e) for e in vm) <= 0.10, [round(e, 3) for e in vm]


def test_held_out_set_7_single_server_nvls_tables(priced):
    # held-out set 7: two one-server 8 x H100 tables (NVLS, NCCL's choice), committed before any error was
    # computed; with NVLS's pipeline fill inside one server (nvls.nvls_rounds) each is within 5% by its
    # geomean and every row within 10% (7.8% and 6.9%, up to +23%, without the fill)
    rows, summ, published = priced
    cases = _set(published, "7")
    assert set(cases) == {"nccl-tests-290-hgx-h100-1x8", "aws-batch-p5-1x8"}
    for name, case in cases.items():
        assert case["split"] == "held-out" and case["algorithm"] == "nccl" and case["gpus"] == 8
        mine = [r for r in rows if r["case"] == name]
        assert mine and all(r["ran"].startswith("nvls/Simple") for r in mine)
        assert summ["tables"][name] <= 0.05, (name, summ["tables"][name])
        assert max(abs(r["error"]) for r in mine) <= 0.10, [round(r["error"], 3) for r in mine]


def test_held_out_set_8_single_server_nvls_tables(priced):
    # held-out set 8: three one-server tables of Azure's benchmarking guide (ND H100 v5 and ND H200 v5,
    # NCCL_ALGO=NVLS, in-place busbw only), committed before any error was computed; each within 5% by its
    # geomean and every row within 10%, priced at the NCCL version each page states
    rows, summ, published = priced
    cases = _set(published, "8")
    assert len(cases) == 3
    for name, case in cases.items():
        assert case["split"] == "held-out" and case["algorithm"] == "nccl-nvls" and case["gpus"] == 8
        assert case["column"] == "in-place busbw" and all("busbw_GBps" in r for r in case["rows"])
        mine = [r for r in rows if r["case"] == name]
        assert len(mine) == 8 and all(r["ran"].startswith("nvls/Simple") for r in mine)
        assert all(f"nccl={case['nccl_version']}" in r["topology"] for r in mine)
        assert summ["tables"][name] <= 0.05, (name, summ["tables"][name])
        assert max(abs(r["error"]) for r in mine) <= 0.10, [round(r["error"], 3) for r in mine]
