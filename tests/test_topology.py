"""Topologies as data: the BML paper's counts (section 3.1), neighbour sets, routes and the address plan."""

import ipaddress
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcomm.costmodel import PRESETS, collective_cost
from dpcomm.errors import UserError
from dpcomm.topology import (
    BCube,
    FatTree,
    Star,
    bcube_shape,
    parse_topology,
    plan_addresses,
    server_digits,
    server_index,
)


def test_bcube_3_2_matches_the_paper_testbed():
    t = parse_topology("bcube:3,2")
    assert (t.servers, t.switch_count, t.nics_per_server, t.link_count) == (9, 6, 2, 18)
    assert len(t.switches()) == 6 and all(sw.ports == 3 for sw in t.switches())
    # Section 3.2 example: [0,0] exchanges with [0,1],[0,2] on level 0 and [1,0],[2,0] on level 1.
    ids = {s: server_digits(s, 3, 2) for s in range(9)}
    assert [ids[s] for s in t.neighbours(0, 0)] == [(0, 1), (0, 2)]
    assert [ids[s] for s in t.neighbours(0, 1)] == [(1, 0), (2, 0)]
    # "each server has four 1-hop neighboring servers"
    assert all(len(t.neighbours(s, 0)) + len(t.neighbours(s, 1)) == 4 for s in range(9))
    assert t.level_groups(0) == ((0, 1, 2), (3, 4, 5), (6, 7, 8))
    assert t.level_groups(1) == ((0, 3, 6), (1, 4, 7), (2, 5, 8))


def test_bcube_16_4_has_65536_servers():
    t = BCube(n=16, k=4)  # the formulas answer at once; a spec this large is refused (MAX_SERVERS)
    assert t.servers == 65536 and t.nics_per_server == 4
    assert t.switch_count == 4 * 16**3 == 4 * t.servers // 16  # k*N/n
    assert t.link_count == 4 * 65536


@pytest.mark.parametrize("k", [2, 4, 8, 16])
def test_fattree_counts(k):
    t = parse_topology(f"fattree:{k}")
    n = t.servers
    assert n == k**3 // 4
    assert t.switch_count == 5 * k**2 // 4 == 5 * n // k  # 5*N/n with n = k ports
    assert len(t.switches()) == t.switch_count
    assert len(t.switch_links()) + n == t.link_count == 3 * k**3 // 4
    # every switch uses exactly k ports (core switches: k pods; edge/agg: k/2 down + k/2 up)
    used = {sw.index: len(t.members(sw.index)) for sw in t.switches()}
    for a, b in t.switch_links():
        used[a] += 1
        used[b] += 1
    assert set(used.values()) == {k}


@pytest.mark.parametrize(("n", "k"), [(2, 2), (3, 2), (4, 2), (2, 3), (3, 3), (16, 2)])
def test_bcube_switch_ratio_against_fattree(n, k):
    """BCube needs k*N/n switches, a Fat-Tree of the same n-port switches 5*N/n: a ratio of k/5 (40-80%)."""
    t = BCube(n=n, k=k)
    assert t.switch_count * 5 == k * 5 * t.servers // n
    assert len(t.switches()) == t.switch_count


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 5), st.integers(1, 3), st.data())
def test_bcube_structure(n, k, data):
    t = BCube(n=n, k=k)
    s = data.draw(st.integers(0, t.servers - 1))
    assert server_index(server_digits(s, n, k), n) == s
    for level in range(k):
        # a level-l switch holds the n servers that differ from s only in digit l (digit index k-1-l)
        members = t.members(t.switch_of(s, level))
        assert len(members) == n and s in members
        for m in members:
            diff = [
                i for i in range(k) if server_digits(m, n, k)[k - 1 - i] != server_digits(s, n, k)[k - 1 - i]
            ]
            assert diff in ([], [level])
    # every server NIC is on exactly one switch; every switch has n servers, one per NIC level
    links = t.server_links()
    assert len(links) == t.servers * k
    per_switch = {}
    for link in links:
        per_switch.setdefault(link.switch, []).append(link)
    assert len(per_switch) == t.switch_count
    assert all(len(v) == n and len({x.nic for x in v}) == 1 for v in per_switch.values())


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 4), st.integers(1, 3), st.data())
def test_bcube_route_corrects_one_digit_per_hop(n, k, data):
    t = BCube(n=n, k=k)
    src = data.draw(st.integers(0, t.servers - 1))
    dst = data.draw(st.integers(0, t.servers - 1))
    hops = t.route(src, dst)
    differing = sum(a != b for a, b in zip(server_digits(src, n, k), server_digits(dst, n, k), strict=True))
    assert len(hops) == differing  # shortest path: one hop per differing digit
    cur = src
    for hop in hops:
        assert hop.server == cur and hop.next_server in t.neighbours(cur, hop.nic)
        cur = hop.next_server
    assert cur == dst


def test_star_and_fattree_neighbours_and_routes():
    s = Star(n=4)
    assert (s.servers, s.switch_count, s.link_count) == (4, 1, 4)
    assert s.neighbours(2, 0) == (0, 1, 3)
    assert [h.next_server for h in s.route(0, 3)] == [3] and s.route(1, 1) == ()
    f = FatTree(k=4)
    assert f.neighbours(0, 0) == (1,) and f.neighbours(5, 0) == (4,)  # k/2 = 2 servers per edge switch
    assert f.members(f.switch_count - 1) == ()  # a core switch has no servers


def test_address_plan():
    t = parse_topology("bcube:3,2")
    plan = plan_addresses(t)
    assert str(plan.address(0, 0)) == "10.77.0.1/24"
    assert str(plan.address(8, 1)) == "10.77.1.9/24"
    assert str(plan.subnet(1)) == "10.77.1.0/24"
    table = plan.table()
    assert len(table) == 18 and len({a for _, _, a in table}) == 18
    for s, l, a in table:
        assert plan.owner(a) == (s, l)
        assert ipaddress.IPv4Interface(a).ip in plan.base
    assert str(plan_addresses(Star(n=4)).address(3, 0)) == "10.77.0.4/24"
    with pytest.raises(ValueError):
        plan.owner("10.77.2.1")
    # 65,536 servers need /15 subnets: they don't fit a /16, they do fit 10.0.0.0/8
    big = BCube(n=16, k=4)
    with pytest.raises(UserError, match="more than"):
        plan_addresses(big)
    p8 = plan_addresses(big, "10.0.0.0/8")
    addrs = {p8.address(s, l).ip for s, l in itertools.product([0, 65535], range(4))}
    assert len(addrs) == 8 and all(a in p8.base for a in addrs)


@pytest.mark.parametrize(
    "spec", ["", "star", "star:0", "bcube:3", "bcube:1,2", "fattree:3", "mesh:4", "star:4,4", "bcube:3,x"]
)
def test_bad_specs_are_one_line_user_errors(spec):
    with pytest.raises(UserError) as exc:
        parse_topology(spec)
    assert "\n" not in str(exc.value) and str(exc.value)


def test_specs_round_trip():
    for spec in ["star:9", "fattree:4", "bcube:3,2", "bcube:2,3"]:
        assert parse_topology(spec).spec == spec
    assert parse_topology(" bcube : 3, 2 ").spec == "bcube:3,2"


# ---------------------------------------------------------------------------------------------- bcube_shape


def _shapes(p: int) -> list[tuple[int, int]]:
    """Every BCube(n, k) with n^k == p and k >= 2, by brute force (the oracle)."""
    return [(n, k) for n in range(2, p + 1) for k in range(2, p.bit_length() + 1) if n**k == p]


def test_bcube_shape_for_every_p_up_to_1024():
    """Every P in 1..1024: refused unless P = n^k with k >= 2; then the most levels, which is also the
    cheapest shape by BML's formula for every op, at small and large messages."""
    net = PRESETS["10gbe"]
    accepted = 0
    for p in range(1, 1025):
        shapes = _shapes(p)
        if not shapes:
            with pytest.raises(UserError, match=f"got {p}"):
                bcube_shape(p)
            continue
        accepted += 1
        n, k = bcube_shape(p)
        assert n**k == p and k == max(kk for _, kk in shapes)
        for op in ("allreduce", "broadcast", "reduce"):
            for m in (1e3, 1e8):  # bytes
                best = min(collective_cost(op, "bcube", m, p, net, n=a, k=b) for a, b in shapes)
                assert collective_cost(op, "bcube", m, p, net) == pytest.approx(best, rel=1e-12)
    assert accepted == 41  # the perfect powers in 2..1024: 4, 8, 9, 16, 25, 27, 32, ..., 1000, 1024


@pytest.mark.parametrize(
    ("p", "shape"), [(32, (2, 5)), (64, (2, 6)), (256, (2, 8)), (9, (3, 2)), (4, (2, 2))]
)
def test_bcube_shape_pinned(p, shape):
    assert bcube_shape(p) == shape


def test_bcube_shape_given_n_or_k():
    assert bcube_shape(64, k=3) == (4, 3) and bcube_shape(64, k=2) == (8, 2) and bcube_shape(64, 8) == (8, 2)
    assert bcube_shape(6, 6, 1) == (6, 1) and bcube_shape(6, k=1) == (6, 1) and bcube_shape(27, n=3) == (3, 3)
    for p, n, k in ((10, None, 2), (8, 3, 2), (8, 3, None), (6, None, None), (1, None, None), (4, 1, None)):
        with pytest.raises(UserError):
            bcube_shape(p, n, k)


def test_bcube_digit_helpers_agree_with_the_switches():
    cube = BCube(n=3, k=2)
    for s in range(cube.size):
        for level in range(cube.k):
            assert cube.domain(s, level) == cube.members(cube.switch_of(s, level))
            assert cube.digit(s, level) == cube.digits(s)[cube.k - 1 - level]


@pytest.mark.parametrize(
    "spec",
    [
        "fattree:48",
        "fattree:1000",
        "bcube:1000,3",
        "bcube:2,15",
        "bcube:3,999999999",
        "star:100000000",
        "star:16385",
    ],
)
def test_specs_beyond_max_servers_are_refused_from_their_numbers(spec):
    with pytest.raises(UserError, match="more than the 16,384"):
        parse_topology(spec)


def test_max_servers_admits_bml_s_largest_study():
    from dpcomm.topology import MAX_SERVERS

    assert MAX_SERVERS >= 4096
    for spec in ("star:16384", "fattree:40", "bcube:64,2", "bcube:4,7", "bcube:2,14"):
        assert parse_topology(spec).servers <= MAX_SERVERS
    with pytest.raises(UserError, match="more than 9 digits"):
        parse_topology("star:" + "9" * 5000)


@pytest.mark.parametrize(
    ("name", "gpus_nics_transport"),
    [
        ("dgx-h200", (8, 8, "ib")),
        ("hgx-h200", (8, 8, "ib")),
        ("p4de", (8, 4, "efa")),
        ("p5e", (8, 32, "efa")),
        ("a4", (8, 8, "roce")),
        ("a4-highgpu-8g", (8, 8, "roce")),
        ("nd-h100-v5", (8, 8, "ib")),
        ("nd-h200-v5", (8, 8, "ib")),
        ("nd-h200v5", (8, 8, "ib")),
        ("oci-h100", (8, 16, "roce")),
        ("bm-gpu-h100-8", (8, 16, "roce")),
        ("a3-ultra", (8, 8, "roce")),
        ("a3-ultragpu-8g", (8, 8, "roce")),
        ("oci-h200", (8, 8, "roce")),
        ("bm-gpu-h200-8", (8, 8, "roce")),
    ],
)
def test_presets_users_type(name, gpus_nics_transport):
    from dpcomm.topology import parse_multigpu

    t = parse_multigpu(f"{name}:2")
    assert (t.gpus, t.nic_count, t.transport) == gpus_nics_transport and t.hosts == 2
    assert t.net == "star" and t.intra_eff < 1 and not t.assumed  # as every preset: NVLink's achievable rate


def test_an_unknown_topology_lists_every_preset(capsys):
    from dpcomm.cli.main import main
    from dpcomm.topology.gpu_presets import PRESETS

    assert main(["netsim", "--topology", "h200:2", "--sizes", "1M"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(f"{n}" in err for n in PRESETS if n != "testbed"), err
    with pytest.raises(SystemExit):
        main(["netsim", "--help"])
    out = capsys.readouterr().out
    want = ("hgx-h200:S", "dgx-b200:S", "p4d:S", "p5e:S", "nd-h100-v5:S", "oci-h100:S")
    want += ("a3-ultra:S", "oci-h200:S", "nd-h200-v5:S")
    assert all(n in out for n in want)


def test_a_hand_written_spec_says_what_it_assumed_and_block_bytes_needs_lp(capsys):
    from dpcomm.cli.main import main

    assert main(["netsim", "--topology", "gpus:2,8,nic=400gbit", "--sizes", "1M"]) == 0
    assert "assumed" in capsys.readouterr().out
    assert main(["netsim", "--topology", "gpus:2,8,nic=400gbit,intra_eff=0.8,net=star", "--sizes", "1M"]) == 0
    assert "assumed" not in capsys.readouterr().out
    assert main(["netsim", "--topology", "dgx-h100:2", "--block-bytes", "64K", "--sizes", "1M"]) == 2
    assert "lp is not among the algorithms" in capsys.readouterr().err


def test_efa_s_fraction_follows_the_nccl_version_a_spec_states():
    # EFA's achievable fraction depends on NCCL's version: 0.63 fitted on NCCL 2.9.9 (NVIDIA/nccl#527), where
    # 2 p4d with NCCL 2.23.4 and aws-ofi-nccl 1.13.2 move 76.2 GB/s busbw at 1 GiB (AWS's DLAMI guide); from
    # NCCL 2.17 on (2 p4de with NCCL 2.17.1 and aws-ofi-nccl 1.5.0 move 77.6 GB/s at 1 GiB)
    from dpcomm.sim.network import make_fabric, simulate_allreduce
    from dpcomm.sim.network.pricing import default_model
    from dpcomm.topology.multigpu import parse_multigpu
    from dpcomm.topology.transports import transport

    efa = transport("efa")
    assert efa.fraction_for(None) == efa.fraction_for("2.9.9") == efa.fraction_for("2.16.5") == 0.63
    assert efa.fraction_for("2.17.1") == efa.fraction_for("2.18.3") == efa.fraction_for("2.23.4") == 0.895
    assert efa.fraction_for("2.27.7+cuda12.9") == 0.895
    assert parse_multigpu("p4d:2").nic_fraction == 0.63
    assert parse_multigpu("p4d:2,nccl=2.23.4").nic_fraction == 0.895
    assert parse_multigpu("p4d:2,nccl=2.23.4,nic_eff=0.5").nic_fraction == 0.5  # the spec's own wins
    assert transport("ib").fraction_for("2.27.7") == transport("ib").fraction
    busbw = {}
    for spec in ("p4d:2", "p4d:2,nccl=2.23.4"):
        row, _ = simulate_allreduce(default_model(make_fabric(spec, 10e9)), "nccl", 1 << 30, ranks=16)
        busbw[spec] = row.busbw_GBps
    assert busbw["p4d:2"] < 0.8 * 76.21  # 0.63: a quarter short
    assert busbw["p4d:2,nccl=2.23.4"] == pytest.approx(76.21, rel=0.07)
