"""The flow-level network model: max-min rates, routes, goodput, schedules, and agreement with the closed
form on a network where nothing is shared. Pure functions only (a few seconds in all)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcomm.cli.main import main
from dpcomm.collectives import bcube as bml_code
from dpcomm.collectives.schedule import Step
from dpcomm.costmodel.collective import collective_cost
from dpcomm.costmodel.network import Network
from dpcomm.sim.network import FlowModel, Goodput, bml_steps, make_fabric, maxmin_rates, simulate_allreduce
from dpcomm.sim.network.fabric import IDEAL
from dpcomm.topology import BCube

# ---------------------------------------------------------------------------------------------- max-min


def test_maxmin_hand_worked():
    # Bertsekas & Gallager's example shape: link 0 (cap 1) carries flows a, b, c; link 1 (cap 2) carries c, d.
    # a = b = c = 1/3 (link 0 is the bottleneck of all three), d takes what link 1 has left: 2 - 1/3.
    links = np.array([[0, -1], [0, -1], [0, 1], [1, -1]])
    r = maxmin_rates(np.array([1.0, 2.0]), links, np.ones(2))
    assert np.allclose(r, [1 / 3, 1 / 3, 1 / 3, 5 / 3])
    # weights: a flow that loads link 0 twice as much gets half the others' rate at the same fill level
    r = maxmin_rates(np.array([3.0]), np.array([[0], [0]]), np.array([[1.0], [2.0]]))
    assert np.allclose(r, [1.0, 1.0])
    assert np.isinf(maxmin_rates(np.array([1.0]), np.array([[-1]]), np.ones(1))[0])  # no link: unconstrained


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_maxmin_is_feasible_and_every_flow_has_a_bottleneck(data):
    n_links = data.draw(st.integers(1, 6))
    n_flows = data.draw(st.integers(1, 8))
    cap = np.array(data.draw(st.lists(st.floats(0.5, 10), min_size=n_links, max_size=n_links)))
    rows = [
        data.draw(st.lists(st.integers(0, n_links - 1), min_size=1, max_size=3, unique=True))
        for _ in range(n_flows)
    ]
    links = np.full((n_flows, 3), -1)
    for i, r in enumerate(rows):
        links[i, : len(r)] = r
    rate = maxmin_rates(cap, links, np.ones(3))
    load = np.zeros(n_links)
    for i, r in enumerate(rows):
        load[r] += rate[i]
    assert (load <= cap * (1 + 1e-9)).all()
    # max-min fairness: each flow crosses a full link on which no flow gets more than it does
    for i, r in enumerate(rows):
        assert any(
            load[l] >= cap[l] * (1 - 1e-9)
            and all(rate[j] <= rate[i] * (1 + 1e-9) for j, rj in enumerate(rows) if l in rj)
            for l in r
        ), (i, rows, rate)


def _naive_maxmin(cap, rows, w):
    """Progressive filling written out flow by flow: the independent reference of the vectorised solver."""
    rate, frozen, left = [0.0] * len(rows), [False] * len(rows), list(cap)
    while not all(frozen):
        load = [0.0] * len(cap)
        for i, r in enumerate(rows):
            for l, x in zip(r, w[i], strict=True):
                load[l] += 0.0 if frozen[i] else x
        d = min(left[l] / load[l] for l in range(len(cap)) if load[l] > 0)
        full = {l for l in range(len(cap)) if load[l] > 0 and left[l] / load[l] <= d * (1 + 1e-9)}
        left = [left[l] - d * load[l] for l in range(len(cap))]
        for i, r in enumerate(rows):
            if not frozen[i]:
                rate[i] += d
                frozen[i] = any(l in full for l in r)
    return rate


def test_vectorised_and_chunked_filling_equal_the_naive_one():
    from dpcomm.sim.network.maxmin import fill_chunked

    rng = np.random.default_rng(1)
    for _ in range(20):
        n_links, n_flows = int(rng.integers(2, 8)), int(rng.integers(1, 30))
        cap = rng.uniform(0.5, 5, n_links)
        rows = [
            list(rng.choice(n_links, size=int(rng.integers(1, min(3, n_links) + 1)), replace=False))
            for _ in range(n_flows)
        ]
        w = [list(rng.uniform(0.1, 2, len(r))) for r in rows]
        links, wts = np.full((n_flows, 3), -1), np.zeros((n_flows, 3))
        for i, r in enumerate(rows):
            links[i, : len(r)], wts[i, : len(r)] = r, w[i]
        want = _naive_maxmin(cap, rows, w)
        assert maxmin_rates(cap, links, wts) == pytest.approx(want, rel=1e-9)
        use = links >= 0

        def entries(i0, i1, use=use, links=links, wts=wts):  # chunks of 4 flows, as a huge step is filled
            f, c = np.nonzero(use[i0:i1])
            return f, links[i0:i1][use[i0:i1]], wts[i0:i1][use[i0:i1]]

        chunks = [(i, min(i + 4, n_flows)) for i in range(0, n_flows, 4)]
        assert fill_chunked(cap, n_flows, chunks, entries) == pytest.approx(want, rel=1e-9)


def test_batched_filling_is_the_single_filling_bit_for_bit():
    from dpcomm.sim.network.maxmin import fill, fill_many

    rng = np.random.default_rng(2)
    caps, flows, links, wts, probs, lstart, f0, l0 = [], [], [], [], [], [], 0, 0
    want = []
    for i in range(12):  # 12 independent problems, each its own links, filled together
        n_links, n_flows = int(rng.integers(1, 7)), int(rng.integers(1, 9))
        cap = rng.uniform(0.5, 5, n_links)
        f = np.repeat(np.arange(n_flows), rng.integers(1, min(3, n_links) + 1, n_flows))
        lk = np.concatenate([rng.choice(n_links, int((f == j).sum()), replace=False) for j in range(n_flows)])
        w = rng.uniform(0.1, 2, len(f))
        want.append(fill(cap, f, lk, w, n_flows))
        caps.append(cap), flows.append(f + f0), links.append(lk + l0), wts.append(w)
        probs.append(np.full(n_flows, i)), lstart.append(l0)
        f0, l0 = f0 + n_flows, l0 + n_links
    rate, froze, full_at = fill_many(
        np.concatenate(caps), np.array(lstart), *map(np.concatenate, (flows, links, wts, probs))
    )
    assert np.array_equal(rate, np.concatenate(want)) and (froze > 0).all()


@pytest.mark.parametrize("ack", [0.25, 0.0])
def test_paired_filling_is_the_filling_of_forward_and_reverse_entries_bit_for_bit(ack):
    from dpcomm.sim.network.maxmin import fill_many, fill_paired

    rng = np.random.default_rng(4)
    lstart, flows, probs, n_links, f0 = [], [], [], 0, 0
    for i in range(12):  # 12 problems, each its own cables (links 2j, 2j + 1), each flow one way per cable
        cables, n_flows = int(rng.integers(1, 5)), int(rng.integers(1, 9))
        for _ in range(n_flows):
            c = rng.choice(cables, int(rng.integers(1, min(3, cables) + 1)), replace=False)
            flows.append(n_links + 2 * c + rng.integers(0, 2, len(c)))
        probs.append(np.full(n_flows, i)), lstart.append(n_links)
        n_links, f0 = n_links + 2 * cables, f0 + n_flows
    cap = rng.choice([1.0, 2.0, 3.5], n_links)  # equal capacities: ties, as in symmetric steps
    count = np.array([len(x) for x in flows])
    flow_of, link, prob = np.repeat(np.arange(f0), count), np.concatenate(flows), np.concatenate(probs)
    got = fill_paired(cap, np.array(lstart), flow_of, link, prob, 1.1, ack)
    # the plain entries: each flow's forward links with weight 1.1, then their reverses with ``ack``
    rows = [np.concatenate([x, x ^ 1]) if ack else x for x in flows]
    wts = [np.repeat([1.1, ack], len(x)) if ack else np.full(len(x), 1.1) for x in flows]
    f_all = np.repeat(np.arange(f0), [len(x) for x in rows])
    want = fill_many(cap, np.array(lstart), f_all, np.concatenate(rows), np.concatenate(wts), prob)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def _flows_time_ref(fabric, src, dst, nbytes):
    """The step's time filled again after every completion (the flow model's definition), by the plain
    :func:`maxmin_rates` on the fabric's routes: the general path the engine's shortcuts must equal."""
    g = fabric.goodput
    keep = (nbytes > 0) & (src != dst)
    src, dst, left = src[keep], dst[keep], nbytes[keep].astype(float)
    routes = fabric.routes(src, dst)
    links = np.concatenate([routes, np.where(routes >= 0, routes ^ 1, -1)], axis=1)
    w = np.array([g.fwd] * fabric.hops + [g.ack] * fabric.hops)
    t, idx, fills = 0.0, np.arange(len(src)), 0
    while idx.size:
        r = maxmin_rates(fabric.capacity, links[idx], w)
        fills += 1
        need = left[idx] / r
        dt = need.min()
        done = need <= dt * (1 + 1e-3)
        t += dt
        left[idx] -= r * dt
        idx = idx[~done]
    return t, fills


def test_batched_steps_and_kept_rates_equal_filling_after_every_completion():
    rng = np.random.default_rng(3)
    for spec in ("star:6", "fattree:4", "bcube:2,3", "leafspine:2,4,2"):
        fabric = make_fabric(spec, 1e9)
        model = FlowModel(fabric)
        steps = []
        for i in range(8):  # random flow sets, uneven sizes: several completions each
            n = int(rng.integers(1, 3 * fabric.servers))
            src, dst = rng.integers(0, fabric.servers, (2, n))
            nbytes = rng.choice([0, 1000, 1000, 1500, 4000], n) * (1 + (rng.random(n) < 0.3))
            steps.append(Step(label=str(i), src=src, dst=dst, nbytes=nbytes))
        got = model.step_times(steps)
        want, fills = zip(*(_flows_time_ref(fabric, st.src, st.dst, st.nbytes) for st in steps), strict=True)
        assert got == pytest.approx(want, rel=1e-9), spec
        assert len(steps) < model.rate_solves < sum(fills), spec  # some rates kept, some filled again
        for step in steps:  # each step's first rates (filled in one batch, cached) are the plain filling's
            keep = (step.nbytes > 0) & (step.src != step.dst)
            src, dst = step.src[keep], step.dst[keep]
            routes = fabric.routes(src, dst)
            links = np.concatenate([routes, np.where(routes >= 0, routes ^ 1, -1)], axis=1)
            w = [fabric.goodput.fwd] * fabric.hops + [fabric.goodput.ack] * fabric.hops
            assert np.array_equal(model.rates(src, dst), maxmin_rates(fabric.capacity, links, w)), spec


def test_chunked_steps_and_the_route_table_price_as_the_plain_path(monkeypatch):
    import dpcomm.sim.network.engine as engine

    for spec, algo in [("fattree:4", "ps"), ("bcube:2,3", "lp"), ("leafspine:2,4,2", "ps-dedicated")]:
        want = simulate_allreduce(FlowModel(make_fabric(spec, 10e9)), algo, 4 * 1009)[0].time_s
        with monkeypatch.context() as m:
            m.setattr(engine, "_CHUNK_ENTRIES", 16)  # every step filled chunk by chunk, routes never held
            m.setattr(engine, "_TABLE_MAX", 3)  # the pair table starts over again and again
            got = simulate_allreduce(FlowModel(make_fabric(spec, 10e9)), algo, 4 * 1009)[0].time_s
        assert got == pytest.approx(want, rel=1e-12), (spec, algo)


# ---------------------------------------------------------------------------------------------- fabrics


def _path(fabric, src, dst):
    row = fabric.routes(np.array([src]), np.array([dst]))[0]
    return [fabric.names[l] for l in row if l >= 0]


@pytest.mark.parametrize(
    "spec", ["star:5", "fattree:4", "fattree:6", "bcube:3,2", "bcube:2,3", "leafspine:3,4,2"]
)
def test_routes_are_contiguous_paths_between_the_right_servers(spec):
    f = make_fabric(spec, 1e9)
    rng = np.random.default_rng(0)
    pairs = [(a, b) for a in range(f.servers) for b in range(f.servers) if a != b]
    for i in rng.choice(len(pairs), size=min(60, len(pairs)), replace=False):
        a, b = pairs[i]
        names = _path(f, a, b)
        assert names[0].startswith(f"s{a}>") and names[-1].endswith(f">s{b}"), names
        assert all(x.split(">")[1] == y.split(">")[0] for x, y in zip(names, names[1:], strict=False)), names
    routes = f.routes(*np.array(pairs).T)
    cable = np.where(routes >= 0, routes // 2, -1 - np.arange(routes.shape[1]))  # no path crosses a cable
    assert (np.sort(cable, axis=1)[:, 1:] != np.sort(cable, axis=1)[:, :-1]).all()  # twice (the ACKs' order)
    assert not _path(f, 1, 1)


def test_fattree_paths_climb_only_as_high_as_needed_and_spread_over_the_core():
    f = make_fabric("fattree:4", 1e9)  # 2 servers per edge, 4 per pod
    assert len(_path(f, 0, 1)) == 2 and len(_path(f, 0, 2)) == 4 and len(_path(f, 0, 4)) == 6
    cores = {_path(f, 0, d)[2] for d in range(4, 16)}
    assert len(cores) == 4  # (k/2)^2 cores, all used by one pod's traffic to the others


def test_bcube_paths_relay_one_digit_per_hop():
    f = make_fabric("bcube:3,2", 1e9)
    assert _path(f, 0, 1) == ["s0>L0", "L0>s1"]
    assert _path(f, 0, 4) == ["s0>L1", "L1>s3", "s3>L0", "L0>s4"]  # [0,0] -> [1,0] -> [1,1]


def test_goodput_ceilings_are_the_testbeds():
    g = Goodput()
    assert g.one_way == pytest.approx(0.956, abs=5e-4) and g.duplex == pytest.approx(0.936, abs=5e-4)
    f = make_fabric("star:2", 100e6)
    m = FlowModel(f)
    one = m.rates(np.array([0]), np.array([1]))[0] * 8 / 100e6
    both = m.rates(np.array([0, 1]), np.array([1, 0])) * 8 / 100e6
    assert one == pytest.approx(g.one_way) and both == pytest.approx([g.duplex] * 2)


# ---------------------------------------------------------------------------------------------- schedules


@pytest.mark.parametrize("n,k", [(3, 2), (2, 3), (4, 2)])
def test_bml_steps_are_the_algorithms_transfers(n, k):
    numel = 1000  # not a multiple of k n^k: uneven pieces
    cube = bml_code.BCube(n=n, k=k)
    bounds = bml_code.piece_bounds(numel, cube)
    want = Counter(
        (x.src, x.dst, 4 * (bounds[x.thread * cube.size + x.hi] - bounds[x.thread * cube.size + x.lo]))
        for x in bml_code.transfers(cube, "allreduce")
    )
    got = Counter(m for s in bml_steps(BCube(n=n, k=k), numel, 4) for m in s.transfers())
    assert got == want


# The closed form assumes no link is shared beyond what the algorithm itself puts on a rank's NIC; on an
# ideal (no headers) non-blocking star, or BCube for bml, the flow model must give the same seconds.
_NUMEL = 720720  # divisible by 1..16: every chunk equal, as the closed form assumes


_CASES = [(a, p) for a in ("ring", "be", "mst", "ps", "lp") for p in (4, 5, 8, 9)] + [
    ("bml", p) for p in (4, 8, 9)
]


@pytest.mark.parametrize("algo,p", _CASES)
def test_flow_model_agrees_with_the_closed_form_where_nothing_is_shared(algo, p):
    spec = {4: "bcube:2,2", 8: "bcube:2,3", 9: "bcube:3,2"}[p] if algo == "bml" else f"star:{p}"
    rate, alpha = 1e9, 20e-6
    model = FlowModel(make_fabric(spec, rate, IDEAL), alpha_s=alpha)
    nbytes = 4 * _NUMEL
    block = 4 * 9009 if algo == "lp" else None  # 80 equal blocks
    row, _ = simulate_allreduce(model, algo, nbytes, block_bytes=block)
    net = Network(name="ideal", alpha=alpha, beta=8 / rate)
    cube = BCube(n=3, k=2) if p == 9 else BCube(n=2, k=p.bit_length() - 1)
    opts = {"block_bytes": block} if algo == "lp" else {"n": cube.n, "k": cube.k} if algo == "bml" else {}
    closed = collective_cost("allreduce", "bcube" if algo == "bml" else algo, nbytes, p, net, **opts)
    if algo == "lp":  # the schedule's stages are one block (2 b beta, plus 3 alpha) shorter than Table 1's
        closed -= 2 * block * 8 / rate + 3 * alpha  # count: the chain's end turns a block around at once
    assert row.time_s == pytest.approx(closed, rel=1e-6)


def test_symmetric_steps_are_solved_once():
    model = FlowModel(make_fabric("fattree:16", 10e9))  # 1,024 servers, 2,046 ring steps
    row, _ = simulate_allreduce(model, "ring", 4 * 1024 * 1000)
    assert row.steps == 2046 and model.rate_solves == 1


def test_oversubscribed_leafspine_slows_the_ring_by_the_ratio():
    t = {}
    for r in (1, 4):
        model = FlowModel(make_fabric(f"leafspine:4,8,{r}", 10e9, IDEAL))
        t[r] = simulate_allreduce(model, "ring", 4 * 32 * 1000)[0].time_s
    assert t[4] == pytest.approx(4 * t[1])  # every step waits for the one flow that crosses a leaf's uplink


# ---------------------------------------------------------------------------------------------- CLI


def test_cli_rows_and_errors(capsys, tmp_path):
    png = tmp_path / "links.png"
    assert (
        main(
            [
                "netsim",
                "--topology",
                "bcube:3,2",
                "--algorithms",
                "bml,ps",
                "--sizes",
                "1M",
                "--rate",
                "100mbit",
                "--json",
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert [r["algorithm"] for r in rows] == ["bml", "ps"] and png.stat().st_size > 0
    assert rows[0]["time_s"] < rows[1]["time_s"]
    for bad, msg in [
        (["--topology", "ring:4"], "unknown topology kind"),
        (["--topology", "star:4", "--rate", "fast"], "bad rate"),
        (["--topology", "star:4", "--sizes", "1X"], "--sizes"),
        (["--topology", "star:4", "--algorithms", "bml"], "bcube"),
        (["--topology", "star:4", "--algorithms", "nope"], "unknown algorithm"),
    ]:
        assert main(["netsim", *bad]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1, err


# ---------------------------------------------------------------------------------------------- simulate


@pytest.mark.parametrize("algo", ["ring", "be", "mst", "ps", "lp", "bcube", "native"])
def test_simulate_on_a_topology_agrees_with_the_closed_form_where_nothing_is_shared(algo):
    from dpcomm.costmodel.network import PRESETS
    from dpcomm.sim.network.pricing import flow_cost_factory
    from dpcomm.sim.sweep import sweep
    from dpcomm.trace import find_trace

    trace = find_trace("resnet20-cpu-b32")
    net = PRESETS["10gbe"]  # alpha 45.26 us, beta 0.8 ns/byte = 10 Gbit/s, gamma 0
    nodes = [8] if algo == "bcube" else [5, 8]
    spec = "bcube:2,3" if algo == "bcube" else "star:8"
    flow = flow_cost_factory(make_fabric(spec, 10e9, IDEAL), algo, net.alpha)
    schedules = ["wfbp", "mgwfbp", "single"]
    got = sweep(trace, flow, nodes, schedules)
    want = sweep(trace, net, nodes, schedules, algo=algo)
    # LP's schedule is one block shorter per call than Table 1's count (see the collective test above)
    # small messages split into uneven pieces: the flow model waits for the one element longer (< 0.1%)
    tol = 0.02 if algo == "lp" else 1e-3
    for g, w in zip(got, want, strict=True):
        assert (g.nodes, g.schedule) == (w.nodes, w.schedule)
        assert g.t_iter_s == pytest.approx(w.t_iter_s, rel=tol), (g.nodes, g.schedule)
        if algo != "lp":
            for eg, ew in zip(g.result.comm, w.result.comm, strict=True):  # every message priced alike
                assert eg.end_s - eg.start_s == pytest.approx(ew.end_s - ew.start_s, rel=tol, abs=1e-9)


def test_simulate_cli_on_an_oversubscribed_fabric(capsys):
    args = ["simulate", "--trace", "resnet20-cpu-b32", "--nodes", "16", "--schedules", "wfbp", "--json"]
    assert main([*args, "--topology", "leafspine:4,4,1"]) == 0
    full = json.loads(capsys.readouterr().out)[0]["t_iter_s"]
    assert main([*args, "--topology", "leafspine:4,4,4"]) == 0
    over = json.loads(capsys.readouterr().out)[0]["t_iter_s"]
    assert over > full  # the ring's leaf-crossing flows get a quarter of a link
    assert main([*args, "--topology", "star:8"]) == 2
    assert "does not fit" in capsys.readouterr().err


def test_lp_blocks_and_every_schedule_s_flows_are_bounded_before_building():
    from dpcomm.costmodel.lp import MAX_BLOCKS
    from dpcomm.errors import UserError
    from dpcomm.sim.network.algorithms import check_allreduce, check_work, schedule

    fabric = make_fabric("star:4", 10e9)
    block = check_allreduce("lp", fabric, 1 << 30, 0.0, block_bytes=1)  # 2**30 one-byte blocks asked for
    assert block == (1 << 30) // MAX_BLOCKS
    assert len(schedule("lp", fabric, 4096, 0.0, block_bytes=1)) == 1024 + 2 * 4 - 2  # one element each
    with pytest.raises(UserError, match="flows over all its steps"):
        check_work("ring", 16_384)
    with pytest.raises(UserError, match="flows in one step"):
        check_work("ps", 8_192)
    check_work("ps", 4_096)  # BML's largest study fits


def test_netsim_imports_no_torch_for_dpcomms_own_collectives():
    # ring, be, mst, lp and ps price the schedules of dpcomm.collectives, which run on torch; their schedules
    # are plain data (dpcomm.schedules), so pricing them must not import torch (1.2-1.4 s of a 2 s run)
    code = (
        "import sys; from dpcomm.cli.main import main; "
        "main(['netsim', '--topology', 'star:8', '--algorithms', 'ring,be,mst,lp,ps,ps-dedicated,native', "
        "'--sizes', '1M', '--json']); print('torch' in sys.modules, file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().endswith("False"), done.stderr
    assert len(json.loads(done.stdout)) == 7


def test_engine_threads_give_the_same_times(monkeypatch):
    # batches of steps priced on threads: the same seconds, bit for bit, as one by one
    from dpcomm.sim.network import engine
    from dpcomm.sim.network.algorithms import schedule

    fabric = make_fabric("fattree:8", 10e9)
    steps = schedule("lp", fabric, 1 << 24, 1e-6, block_bytes=1 << 16)
    got = {}
    for threads in (1, 2):
        monkeypatch.setattr(engine, "THREADS", threads)
        monkeypatch.setattr(engine, "_BATCH_FLOWS", 512)  # many batches, so two run at once
        got[threads] = FlowModel(fabric, 1e-6).run(steps).step_s
    assert got[1] == got[2] and len(got[1]) == len(steps)


@pytest.mark.parametrize("spec", ["star:24", "leafspine:4,6,2", "fattree:8"])
def test_steps_alike_up_to_a_shift_of_servers_are_priced_once_with_the_same_times(spec, monkeypatch):
    # LP's stages between its fill and turn-around are one another moved down the chain: one of them priced,
    # and every schedule's seconds the same, bit for bit, as pricing each step itself
    from dpcomm.sim.network import engine
    from dpcomm.sim.network.algorithms import schedule
    from dpcomm.sim.network.symmetry import shift_period

    fabric = make_fabric(spec, 10e9)
    assert shift_period(fabric) == {"star": 1, "leafspine": 6, "fattree": 16}[spec.split(":")[0]]
    cases = [("lp", 1 << 20, 1 << 14), ("lp", 3 * 1000 * 1003, 1 << 18), ("lp", 1 << 22, None)]
    cases += [(a, 4 * 1009 * 24, None) for a in ("ring", "be", "mst", "ps")]
    for algo, nbytes, block in cases:
        blocks = len(schedule(algo, fabric, nbytes, 1e-6, block_bytes=block)) - 2 * fabric.servers + 2
        steps = schedule(algo, fabric, nbytes, 1e-6, block_bytes=block)
        shifted = FlowModel(fabric, 1e-6)
        got = shifted.run(steps).step_s
        with monkeypatch.context() as m:
            m.setattr(engine, "shift_period", lambda fab: 0)
            plain = FlowModel(fabric, 1e-6)
            want = plain.run(steps).step_s
        assert got == want, (spec, algo, nbytes)
        if algo == "lp" and blocks + shift_period(fabric) < fabric.servers - 1:  # stages that slide
            assert shifted.rate_solves < plain.rate_solves, (spec, nbytes)
    fabric.capacity[2] /= 2  # a server link slowed by hand: its shifts no longer cost the same
    assert shift_period(fabric) == 0
