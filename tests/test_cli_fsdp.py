"""``dpcomm plan --fsdp`` / ``--hsdp`` and ``dpcomm simulate``'s ``fsdp:``/``hsdp:`` rows, and their costs.

The CLI's plans are compared with the planners called directly; the cluster's FSDP costs with the flow
model's own all-reduce (a group of one rank all-reduces what DDP does; a group of all ranks gathers half a
ring all-reduce); ``--hsdp auto`` with every explicit group size; the ``fully_shard`` code is run against
the zoo's model with a recording ``fully_shard``. In-process, no workers. Budget: ~15 s.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpcomm.cli.main import main
from dpcomm.costmodel import resolve_network
from dpcomm.errors import UserError
from dpcomm.planner.fsdp import fsdp_time, plan_fsdp, ring_costs
from dpcomm.planner.fsdp_unit import UNIT_S_CUDA
from dpcomm.trace import find_trace

TRACE = "llama-tiny-h200bf16-b64"  # 39 modules: the zoo's llama-tiny, bf16 on an H200


def _json(capsys, argv):
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _flow_model(spec: str):
    from dpcomm.sim.network import make_fabric, parse_fabric_topology
    from dpcomm.sim.network.pricing import default_model

    return default_model(make_fabric(parse_fabric_topology(spec), 10e9))


def test_plan_fsdp_is_the_planners_plan_on_a_flat_network(capsys):
    argv = ["plan", "--trace", TRACE, "--nodes", "8", "--network", "10gbe", "--fsdp", "optimal", "--gap", "0"]
    got = _json(capsys, [*argv, "--memory", "300K", "--json"])
    tr = find_trace(TRACE)
    ag, rs = ring_costs(resolve_network("10gbe"), 8)
    want = plan_fsdp("optimal", tr, ag, rs, memory=300 * 1024, max_depth=2, unit_s=UNIT_S_CUDA)
    assert got["unit_s"] == UNIT_S_CUDA  # --overlap streams (a GPU's): FSDP2's fixed cost per unit there
    assert got["kind"] == "fsdp" and got["shard_group"] == 8
    assert [tuple(u) for u in got["units"]] == list(want.units)
    assert (got["depth"], got["reshard_after_forward"]) == (want.depth, want.reshard_after_forward)
    assert got["t_iter_s"] == pytest.approx(want.time_s, rel=1e-12)
    assert got["peak_bytes"] == want.peak_bytes <= 300 * 1024
    assert got["sha256"] == want.sha256() and got["gap"] == 0
    assert got["fit_error"] == 0 and got["planned_t_iter_s"] == got["t_iter_s"]  # ring costs: lines already
    compute = tr.t_f + tr.t_b
    assert got["speedup"] == pytest.approx(8 * compute / want.time_s)
    assert main(argv) == 0  # the table and the code
    out = capsys.readouterr().out
    assert "fully_shard(model, mesh=mesh" in out and "t_iter" in out


def test_cluster_costs_agree_with_the_flow_models_all_reduce():
    """On dgx-h100:2 (16 GPUs): a group of 1 rank all-reduces what DDP's all-reduce costs; a group of 16
    gathers half of NCCL's ring all-reduce over the 16; a group of 8 (one server, NVLink) half of it over
    the first 8 ranks. Groups that straddle servers are refused."""
    from dpcomm.sim.fsdp_costs import flow_mesh_costs, shard_choices
    from dpcomm.sim.network.pricing import FlowCost

    model = _flow_model("dgx-h100:2")
    costs = flow_mesh_costs(model, 16)
    B = np.array([3e6, 64e6, 400e6])
    for b in B:
        ddp = FlowCost(model=model, algo="nccl", ranks=16)(b)
        assert costs(1)[2](b) == pytest.approx(ddp, rel=1e-9) and costs(1)[0](b) == 0
        assert costs(16)[0](b) == pytest.approx(FlowCost(model=model, algo="nccl-ring", ranks=16)(b) / 2)
        assert costs(16)[2] is None
        assert costs(8)[1](b) == pytest.approx(FlowCost(model=model, algo="nccl-ring", ranks=8)(b) / 2)
    assert np.allclose(costs(8)[2].many(B), [costs(8)[2](b) for b in B])
    assert costs(8)[2](B[1]) < costs(1)[2](B[1])  # an eighth of the bytes across the servers
    assert shard_choices(model, 16) == [1, 2, 4, 8, 16]
    assert shard_choices(_flow_model("dgx-h100:3"), 24) == [1, 2, 4, 8, 24]  # 3, 6, 12 straddle servers
    with pytest.raises(UserError, match="straddles servers of 8 GPUs"):
        flow_mesh_costs(_flow_model("dgx-h100:3"), 24)(12)


def test_hsdp_auto_is_the_best_explicit_group_on_a_cluster(capsys):
    base = ["plan", "--trace", TRACE, "--topology", "dgx-h100:2", "--fsdp", "optimal", "--json"]
    base += ["--memory", "600K", "--state-bytes", "4M", "--max-depth", "1"]
    auto = _json(capsys, [*base, "--hsdp", "auto"])
    assert auto["nodes"] == 16 and auto["kind"] == "hsdp"
    times = {}
    for G in (1, 2, 4, 8, 16):
        try:
            times[G] = _json(capsys, [*base, "--hsdp", str(G)])["t_iter_s"]
        except AssertionError:  # none fits at this group size: one line, exit 2
            times[G] = None
    fits = {G: t for G, t in times.items() if t is not None}
    best = min(fits.values())
    assert best * (1 - 1e-12) <= auto["t_iter_s"] <= best * 1.005  # within --gap's 0.5%
    assert times[auto["shard_group"]] == pytest.approx(auto["t_iter_s"], rel=1e-12)
    assert auto["memory_per_rank_bytes"] == auto["peak_bytes"] + 4 * 2**20 / auto["shard_group"]
    assert auto["memory_per_rank_bytes"] <= 600 * 1024


def test_simulate_fsdp_rows_beside_ddp_on_a_cluster(capsys):
    argv = ["simulate", "--trace", TRACE, "--topology", "dgx-h100:2", "--nodes", "8,16"]
    argv += ["--schedules", "ddp,fsdp:optimal,hsdp:optimal,hsdp:per-block:8", "--memory", "400K"]
    rows = _json(capsys, [*argv, "--json"])
    assert [(r["nodes"], r["schedule"]) for r in rows] == [
        (n, s) for n in (8, 16) for s in ("ddp", "fsdp:optimal", "hsdp:optimal", "hsdp:per-block:8")
    ]
    for r in rows:
        assert r["efficiency"] == pytest.approx(r["speedup"] / r["nodes"])
        if r["schedule"] != "ddp":
            assert r["memory_bytes"] <= 400 * 1024
    at16 = {r["schedule"]: r for r in rows if r["nodes"] == 16}
    assert at16["hsdp:per-block:8"]["shard_group"] == 8
    assert at16["hsdp:optimal"]["t_iter_s"] <= at16["fsdp:optimal"]["t_iter_s"] * 1.005  # G=16 is a choice
    plan = _json(capsys, ["plan", "--trace", TRACE, "--topology", "dgx-h100:2", "--fsdp", "optimal",
                          "--memory", "400K", "--json"])  # fmt: skip
    assert plan["t_iter_s"] == pytest.approx(at16["fsdp:optimal"]["t_iter_s"], rel=1e-12)
    # the row's time is the model's for its own plan and costs
    from dpcomm.planner.fsdp import Modules
    from dpcomm.sim.fsdp_costs import flow_mesh_costs

    ag, rs, _ = flow_mesh_costs(_flow_model("dgx-h100:2"), 16)(16)
    f, b, m = Modules.from_trace(find_trace(TRACE)).arrays
    units = [tuple(u) for u in plan["units"]]
    t = fsdp_time(units, f, b, m, ag, rs, depth=plan["depth"], reshard=plan["reshard_after_forward"],
                  unit_s=plan["unit_s"])  # fmt: skip
    assert t == pytest.approx(plan["t_iter_s"], rel=1e-12)
    assert 0 < plan["fit_error"] < 0.5 and plan["planned_t_iter_s"] != plan["t_iter_s"]  # planned on lines
    argv[argv.index("8,16")] = "8"
    assert main(argv) == 0 and "memory" in capsys.readouterr().out  # the table's memory column


def test_fully_shard_code_runs_on_the_zoo_model(monkeypatch, capsys):
    """The printed code, run against llama-tiny with recording stand-ins for fully_shard and the mesh:
    every path exists, every layer's parameters are in exactly one call, the root last."""
    import torch.distributed.device_mesh as dm
    import torch.distributed.fsdp as fsdp_mod

    from dpcomm.cli.plan_fsdp import fsdp_code, module_paths
    from dpcomm.models.zoo import get_model
    from dpcomm.planner.fsdp_model import FsdpPlan

    calls, prefetch = [], []

    def fully_shard(target, **kw):  # FSDP2's FSDPModule methods, recorded
        calls.append((target, kw))
        for mod in target if isinstance(target, list) else [target]:
            mod.set_modules_to_forward_prefetch = lambda ms, mod=mod: prefetch.append(("f", mod, ms))
            mod.set_modules_to_backward_prefetch = lambda ms, mod=mod: prefetch.append(("b", mod, ms))
        return target

    monkeypatch.setattr(fsdp_mod, "fully_shard", fully_shard, raising=False)
    monkeypatch.setattr(dm, "init_device_mesh", lambda *a, **kw: ("mesh", a), raising=False)
    model = get_model("llama-tiny")
    tr = find_trace(TRACE)
    blocks = plan_fsdp("per-block", tr, *ring_costs(resolve_network("10gbe"), 8), depth=1, reshard=True)
    paths = module_paths(tr, blocks.units)
    assert ["layers.0"] in paths and all("layers" not in p for p in paths)  # blocks, never the list
    whole = FsdpPlan(method="whole", num_modules=tr.num_layers, units=[(0, tr.num_layers - 1)], depth=0,
                     reshard_after_forward=True)  # fmt: skip
    assert module_paths(tr, whole.units) == [[""]]
    for plan in (blocks, plan_fsdp("optimal", tr, *ring_costs(resolve_network("10gbe"), 8), memory=200_000)):
        calls.clear(), prefetch.clear()
        paths = module_paths(tr, plan.units)
        exec(fsdp_code(plan, paths, 8), {"model": model})  # noqa: S102 -- our own generated code
        assert calls[-1][0] is model and calls[-1][1]["reshard_after_forward"] is False
        held = []
        for target, _ in calls[:-1]:
            for mod in target if isinstance(target, list) else [target]:
                held += [id(p) for p in mod.parameters()]
        assert len(held) == len(set(held)) == len(list(model.parameters()))
        last = calls[-2][1]["reshard_after_forward"]
        assert last is False and all(kw["reshard_after_forward"] == plan.reshard_after_forward
                                     for _, kw in calls[:-2])  # fmt: skip
        K, d = len(calls) - 1, plan.depth
        assert all(len(ms) <= d for _, _, ms in prefetch)
        assert sum(kind == "f" for kind, _, _ in prefetch) == (K - 1 if d else 0)  # every unit but the last
    capsys.readouterr()


@pytest.fixture(scope="module")
def albert(tmp_path_factory):
    """An ALBERT-style block applied 4 times (``tests._corpus:SharedBlocks``), profiled by the CLI."""
    out = tmp_path_factory.mktemp("albert") / "albert.json"
    argv = ["profile", "--model", "tests._corpus:SharedBlocks", "--input", "long[4,8]:vocab=32",
            "--iters", "1", "--warmup", "0", "-o", str(out)]  # fmt: skip
    assert main(argv) == 0
    return out


def test_plan_fsdp_prints_only_units_shard_runs_on_a_block_applied_four_times(albert, capsys):
    """Issue 46, finding 7: an ALBERT-style block applied 4 times, profiled by the CLI and planned under a
    budget. The printed units are the ones ``shard`` builds from the model (none merged: the block's
    children, whose linears return views, are never split across units) and each call's module paths take
    the parameters shard's call takes."""
    import torch

    from dpcomm.fsdp.groups import shard_groups, shardable_modules
    from dpcomm.planner.fsdp_model import FsdpPlan
    from dpcomm.trace import load_trace
    from tests._corpus import SharedBlocks

    out = albert
    capsys.readouterr()
    got = _json(capsys, ["plan", "--trace", str(out), "--nodes", "2", "--network", "10gbe",
                         "--fsdp", "optimal", "--memory", "6K", "--json"])  # fmt: skip
    plan = FsdpPlan.from_dict(got)
    torch.manual_seed(0)
    model, x = SharedBlocks(), torch.randint(0, 32, (4, 8))
    layer_params = [layer.param_names for layer in load_trace(out).layers]
    groups = shard_groups(model, plan, layer_params, shardable_modules(model, x))
    assert groups.units == plan.units, f"shard merges the printed units: {groups.notes}"
    mods = dict(model.named_modules())

    def under(paths):
        return {n for p in paths for n, _ in mods[p].named_parameters(prefix=p)}

    for k, paths in enumerate(got["modules"]):
        if paths != [""]:
            assert under(paths) == under(groups.modules[k]), (paths, groups.modules[k])
    assert got["peak_bytes"] <= 6 * 1024
    assert main(["plan", "--trace", str(out), "--nodes", "2", "--network", "10gbe", "--fsdp", "optimal"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Module paths are the modules dpcomm.fsdp.shard shards" in text, text


@pytest.mark.parametrize("method", ["per-layer", "optimal"])
def test_simulate_fsdp_rows_plan_over_the_units_shard_can_run(albert, capsys, method):
    """``simulate``'s ``fsdp:`` rows plan over the same atoms as ``plan --fsdp`` and ``shard``: on the
    ALBERT-style trace (layers one ``fully_shard`` call must take together) ``per-layer`` has as many
    units as there are atoms, not layers, and every row is ``plan --fsdp``'s plan and time."""
    from dpcomm.cli._fsdp_atoms import fsdp_atoms
    from dpcomm.trace import load_trace

    capsys.readouterr()
    atoms = fsdp_atoms(load_trace(albert))
    assert atoms is not None and len(atoms) < load_trace(albert).num_layers  # the case has joined layers
    net = ["--trace", str(albert), "--network", "10gbe", "--memory", "6K"]
    row = _json(capsys, ["simulate", *net, "--nodes", "2", "--schedules", f"fsdp:{method}", "--json"])[0]
    fig = albert.parent / f"{method}.png"  # the plan's figure is drawn on the atoms it was planned on
    plan = _json(capsys, ["plan", *net, "--nodes", "2", "--fsdp", method, "--json", "--plot", str(fig)])
    assert fig.stat().st_size > 0
    assert row["units"] == len(plan["units"])
    if method == "per-layer":
        assert row["units"] == len(atoms)
    assert row["t_iter_s"] == pytest.approx(plan["t_iter_s"], rel=1e-12)
    assert row["memory_bytes"] == pytest.approx(plan["peak_bytes"], rel=1e-12)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fsdp", "optimal", "--nodes", "8", "--memory", "1K"], "no optimal plan fits 1,024 bytes"),
        (["--fsdp", "optimal", "--hsdp", "3", "--nodes", "8"], "does not divide 8 ranks"),
        (["--fsdp", "optimal", "--hsdp", "3", "--topology", "dgx-h100:2"], "does not divide 16 ranks"),
        (["--fsdp", "optimal", "--hsdp", "12", "--topology", "dgx-h100:3"], "straddles servers"),
        (["--fsdp", "nope", "--nodes", "8"], "unknown --fsdp method 'nope'"),
        (["--hsdp", "8", "--nodes", "8"], "give --fsdp METHOD"),
        (["--memory", "1M", "--nodes", "8"], "give --fsdp METHOD"),
        (["--fsdp", "optimal", "--hsdp", "two", "--nodes", "8"], "--hsdp takes a shard group size"),
        (["--fsdp", "optimal", "--nodes", "8", "--linear-cost", "0.001,1e-9"], "not --linear-cost"),
        (["--fsdp", "optimal", "--nodes", "8", "--memory", "7Q"], "--memory: cannot read"),
        (
            ["--fsdp", "optimal", "--hsdp", "auto", "--nodes", "8", "--memory", "1M", "--state-bytes", "1G"],
            "no optimal HSDP plan fits",
        ),
    ],
)
def test_plan_bad_input_is_one_line(args, message, capsys):
    assert main(["plan", "--trace", TRACE, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("schedules", "message"),
    [("ddp,fsdp:nope", "unknown FSDP schedule 'fsdp:nope'"), ("hsdp:optimal:5", "does not divide 8 ranks")],
)
def test_simulate_bad_fsdp_schedule_is_one_line(schedules, message, capsys):
    argv = ["simulate", "--trace", TRACE, "--nodes", "8", "--schedules", schedules]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_sampled_front_lies_on_the_exact_front(tmp_path, capsys):
    """``hsdp_front(budgets=n)`` (what ``--plot`` draws) against the exact walk: every sampled point is a
    point of the exact front (gap 0, FSDP on a flat network); ``--plot`` writes a PNG."""
    from dpcomm.planner.fsdp import pareto_front
    from dpcomm.planner.hsdp import hsdp_front

    tr = find_trace(TRACE)
    ag, rs = ring_costs(resolve_network("10gbe"), 8)
    exact = {(p, round(t, 15)) for p, t, _ in pareto_front(tr, ag, rs, max_depth=1)}
    sampled = hsdp_front(tr, ag, rs, None, max_depth=1, budgets=6)
    assert 2 <= len(sampled) <= 6 and all((p, round(t, 15)) in exact for p, t, _ in sampled)
    assert [p for p, _, _ in sampled] == sorted(p for p, _, _ in sampled)
    out = tmp_path / "front.png"
    argv = ["plan", "--trace", TRACE, "--nodes", "8", "--fsdp", "per-block", "--plot", str(out), "--json"]
    assert _json(capsys, argv)["plot"] == str(out) and out.read_bytes()[:4] == b"\x89PNG"


def test_schedule_names_and_ddp_plans_on_a_cluster(capsys):
    from dpcomm.sim.fsdp import parse_fsdp_schedule

    assert parse_fsdp_schedule("hsdp:size:64MB:8") == ("hsdp", "size:64mb", 8)
    assert parse_fsdp_schedule("hsdp:size:64") == ("hsdp", "size:64", None)  # 64 bytes, not G = 64
    assert parse_fsdp_schedule("HSDP:optimal:auto") == ("hsdp", "optimal", None)
    assert parse_fsdp_schedule("fsdp:per-block") == ("fsdp", "per-block", None)
    # plan --topology prices DDP's buckets as simulate --topology does (--nodes: every GPU of the spec)
    cluster = ["--trace", TRACE, "--topology", "dgx-h100:2"]
    plan = _json(capsys, ["plan", *cluster, "--schedule", "optimal", "--json"])
    rows = _json(capsys, ["simulate", *cluster, "--nodes", "16", "--schedules", "optimal", "--json"])
    assert plan["nodes"] == 16 and plan["t_iter_s"] == pytest.approx(rows[0]["t_iter_s"], rel=1e-12)


@pytest.mark.parametrize("bad", ["-1e-3", "nan", "inf", "1ms"])
def test_a_bad_unit_cost_is_one_line(capsys, bad):
    argv = ["plan", "--trace", TRACE, "--nodes", "8", "--network", "10gbe", "--fsdp", "optimal"]
    assert main([*argv, f"--unit-cost={bad}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--unit-cost" in err and len(err.splitlines()) == 1
