"""bcube (BML, Algorithm 1): the plan checked as data against the paper, then run against native.

Budget: a few seconds in the 9-rank launch tests/test_collectives.py's matrix runs in
(``tests/_collective_workers.shared``), which covers 4 = BCube(2,2), 8 = BCube(2,3) and 9 = BCube(3,2).
"""

from __future__ import annotations

import itertools

import pytest

from dpcomm.collectives import bcube as bc
from dpcomm.collectives import get
from dpcomm.costmodel import PRESETS
from dpcomm.costmodel.collective import collective_cost
from dpcomm.errors import UserError
from dpcomm.topology import bcube_shape

CUBES = [bc.BCube(n=2, k=2), bc.BCube(n=2, k=3), bc.BCube(n=3, k=2), bc.BCube(n=4, k=2), bc.BCube(n=3, k=3)]


def _ids(cube: bc.BCube, x: bc.Transfer) -> set[tuple[int, tuple[int, ...]]]:
    """Paper piece IDs <e, v_{k-1}..v_0> of a transfer."""
    return {(x.thread, cube.digits(bc.piece_rank(cube, x.thread, p))) for p in range(x.lo, x.hi)}


def _rank(*digits_msd_first: int, n: int = 3) -> int:
    return sum(d * n**i for i, d in enumerate(reversed(digits_msd_first)))


def test_bcube32_walkthrough_thread0_of_server_00():
    """BML sec. 3.2, Fig. 4: thread 0 on server [0,0] of BCube(3,2), step by step as the paper writes it."""
    cube = bc.BCube(n=3, k=2)
    xs = [x for x in bc.transfers(cube, "allreduce") if x.thread == 0 and _rank(0, 0) in (x.src, x.dst)]
    sent = {(x.phase, x.step, cube.digits(x.dst)): _ids(cube, x) for x in xs if x.src == 0}
    got = {(x.phase, x.step, cube.digits(x.src)): _ids(cube, x) for x in xs if x.dst == 0}
    # aggregation step 1 (level 0): "sends 3 local gradient pieces <0,*,1> to server [0,1]" (<0,*,2> to [0,2])
    assert sent["aggregate", 0, (0, 1)] == {(0, (v, 1)) for v in range(3)}
    assert sent["aggregate", 0, (0, 2)] == {(0, (v, 2)) for v in range(3)}
    # "receives 3 gradient pieces of <0,*,0> from [0,1] and from [0,2]"
    assert got["aggregate", 0, (0, 1)] == got["aggregate", 0, (0, 2)] == {(0, (v, 0)) for v in range(3)}
    # step 2 (level 1): "sends <0,1,0>([0,*]) to server [1,0] and <0,2,0> to [2,0]", receives <0,0,0>
    assert sent["aggregate", 1, (1, 0)] == {(0, (1, 0))} and sent["aggregate", 1, (2, 0)] == {(0, (2, 0))}
    assert got["aggregate", 1, (1, 0)] == got["aggregate", 1, (2, 0)] == {(0, (0, 0))}
    # broadcast step 1 (thread 0 takes level-1 links): <0,0,0> to [1,0] and [2,0]; receives <0,1,0>, <0,2,0>
    assert sent["broadcast", 0, (1, 0)] == sent["broadcast", 0, (2, 0)] == {(0, (0, 0))}
    assert got["broadcast", 0, (1, 0)] == {(0, (1, 0))} and got["broadcast", 0, (2, 0)] == {(0, (2, 0))}
    # broadcast step 2 (level 0): "broadcasts its 3 fully-aggregated gradient pieces"
    assert sent["broadcast", 1, (0, 1)] == {(0, (v, 0)) for v in range(3)}
    # levels per step: thread 0 uses level 0 then 1 (aggregation), 1 then 0 (broadcast); thread 1 the reverse
    levels = {(x.thread, x.phase, x.step): x.level for x in bc.transfers(cube, "allreduce")}
    assert [levels[0, "aggregate", w] for w in (0, 1)] == [0, 1]
    assert [levels[1, "aggregate", w] for w in (0, 1)] == [1, 0]
    assert [levels[0, "broadcast", w] for w in (0, 1)] == [1, 0]


def test_bcube32_step_volumes_in_piece_times():
    """Walk-through timings: 6 T_C, 2 T_C (aggregation), 2 T_C, 6 T_C (broadcast): 16 T_C = 8/9 T_F."""
    cube = bc.BCube(n=3, k=2)
    xs = bc.transfers(cube, "allreduce")
    per_step = {}
    for x in xs:
        if x.src == 0:
            key = (x.thread, x.phase, x.step)
            per_step[key] = per_step.get(key, 0) + x.count
    assert [per_step[0, p, w] for p in ("aggregate", "broadcast") for w in (0, 1)] == [6, 2, 2, 6]
    assert sum(v for (t, _, _), v in per_step.items() if t == 0) == 16


@pytest.mark.parametrize("cube", CUBES, ids=lambda c: f"BCube({c.n},{c.k})")
def test_every_piece_aggregated_once_per_level_and_everyone_ends_with_the_sum(cube: bc.BCube):
    """Symbolic run of the plan: a piece's contributor set grows by one level's domain per step."""
    N, k = cube.size, cube.k
    # state[rank][(thread, pos)] = frozenset of ranks whose contribution the copy holds
    state = [{(t, p): frozenset([r]) for t in range(k) for p in range(N)} for r in range(N)]
    seen = {}  # (thread, pos, owner) -> levels it was aggregated over
    for phase in ("aggregate", "broadcast"):
        for w in range(k):
            xs = [x for x in bc.transfers(cube, "allreduce") if x.phase == phase and x.step == w]
            new = [dict(s) for s in state]
            for x in xs:
                assert cube.digit(x.src, x.level) != cube.digit(x.dst, x.level)
                assert sum(a != b for a, b in zip(cube.digits(x.src), cube.digits(x.dst), strict=True)) == 1
                for p in range(x.lo, x.hi):
                    got = state[x.src][x.thread, p]
                    if x.reduce:
                        assert not got & new[x.dst][x.thread, p], "a contribution counted twice"
                        new[x.dst][x.thread, p] = new[x.dst][x.thread, p] | got
                        seen.setdefault((x.thread, p, x.dst), set()).add((w, x.level))
                    else:
                        new[x.dst][x.thread, p] = got
            state = new
        if phase == "aggregate":  # thread t of rank a now holds the full sum of <t, a>
            for a, t in itertools.product(range(N), range(k)):
                assert state[a][t, bc.position(cube, t, a)] == frozenset(range(N))
    everyone = frozenset(range(N))
    assert all(s[key] == everyone for s in state for key in s)
    for a, t in itertools.product(range(N), range(k)):  # the owner aggregated over each level exactly once
        assert sorted(lvl for _, lvl in seen[t, bc.position(cube, t, a), a]) == list(range(k))


@pytest.mark.parametrize("cube", CUBES, ids=lambda c: f"BCube({c.n},{c.k})")
@pytest.mark.parametrize("op", ["allreduce", "broadcast", "reduce"])
def test_messages_and_bytes_per_rank_match_the_docstring(cube: bc.BCube, op: str):
    N, k, n = cube.size, cube.k, cube.n
    xs = bc.transfers(cube, op, root=N - 1)
    pieces = [sum(x.count for x in xs if x.src == r) for r in range(N)]
    msgs = [sum(1 for x in xs if x.src == r) for r in range(N)]
    if op == "allreduce":  # 2 k (N-1) pieces of M/(kN): 2 (N-1)/N * M bytes; 2 k^2 (n-1) messages
        assert pieces == [2 * k * (N - 1)] * N and msgs == [2 * k * k * (n - 1)] * N
    elif (
        op == "broadcast"
    ):  # the root sends (N-1)/N * M in the scatter, then its share of the broadcast stage
        assert pieces[N - 1] == k * (N - 1) + k * (N - 1) and max(pieces) <= 2 * k * (N - 1)
    else:  # reduce: the root receives (N-1)/N * M in the gather; nobody sends more than allreduce does
        assert sum(x.count for x in xs if x.dst == N - 1 and x.phase == "gather") == k * (N - 1)
        assert max(pieces) <= 2 * k * (N - 1)
    # time in piece units: per thread, the busiest rank's link in each step, summed over the steps, is the
    # paper's 2 (N-1) T_C for every op (BML sec. 3.2: (N-1) T_C per stage)
    for t in range(k):
        busiest = 0
        for phase in bc.OP_PHASES[op]:
            for w in range(k):
                step = [x for x in xs if x.thread == t and x.phase == phase and x.step == w]
                out = max(sum(x.count for x in step if x.src == r) for r in range(N))
                inn = max(sum(x.count for x in step if x.dst == r) for r in range(N))
                busiest += max(out, inn)
        assert busiest == 2 * (N - 1)


def test_cost_model_agrees_with_the_plan():
    """dpcomm.costmodel.bcube charges 2k(n-1) alpha and 2(N-1)/(kN) beta M: the plan's critical path."""
    net = PRESETS["10gbe"]
    cube, M = bc.BCube(n=3, k=2), 9 * 2 * 1000  # bytes, whole pieces
    per_thread_steps = 2 * cube.k * (cube.n - 1)  # messages in series on one thread's links
    expect = per_thread_steps * net.alpha + 2 * (cube.size - 1) * (M / (cube.k * cube.size)) * net.beta
    assert collective_cost("allreduce", "bcube", M, 9, net, n=3, k=2) == pytest.approx(expect)


def test_bad_shape_options_are_user_errors():
    with pytest.raises(UserError):
        get("bcube", n=1)
    with pytest.raises(UserError):
        bc.make_level_groups(1, 2)


def test_interfaces_are_one_per_level(monkeypatch):
    with pytest.raises(UserError, match="needs 2 interfaces"):
        bc.make_level_groups(3, 2, ["eth0"])
    monkeypatch.setenv("DPCOMM_BCUBE_IFACES", "eth0,eth1,eth2")
    with pytest.raises(UserError, match="needs 2 interfaces"):
        bc.make_level_groups(3, 2)
    assert get("bcube").interfaces == ("eth0", "eth1", "eth2")  # read from the environment


def test_piece_bounds_cover_the_tensor():
    cube = bc.BCube(n=3, k=2)
    for numel in (0, 1, 17, 18, 1001):
        b = bc.piece_bounds(numel, cube)
        assert b[0] == 0 and b[-1] == numel and len(b) == 19
        sizes = [y - x for x, y in itertools.pairwise(b)]
        assert max(sizes) - min(sizes) <= 1


@pytest.mark.slow
def test_against_native_on_4_8_9_ranks():
    """All three ops vs torch.distributed on BCube(3,2) (world), (2,3) and (2,2) (sub-groups); 6 refused;
    counted messages and bytes of one allreduce equal the docstring's 2 k^2 (n-1) and 2 (N-1)/N * M. In the
    job where the matrix already ran bcube on ranks 1-8 and 5-8: the sub-groups 0-7 and 0-3 share level
    domains with them (ranks 1 and 3 at level 1), whose store-built groups once took the same prefix and
    hung."""
    from tests import _collective_workers

    out = [r["bcube"] for r in _collective_workers.shared_launch()]  # its 9 ranks, after the matrix
    assert [bad for o in out for bad in o["bad"]] == []
    refused = [o["refused"] for o in out if o["refused"] is not None]
    assert len(refused) == 6 and all("n^k" in r and "got 6" in r for r in refused)
    for o in out:
        for size, (sends, nbytes, m) in o["traffic"].items():
            n, k = bcube_shape(size)
            assert sends == 2 * k * k * (n - 1)
            assert nbytes * size == 2 * (size - 1) * m  # 2 (N-1)/N * M, exactly (M a multiple of k N)
    assert sorted(len(o["traffic"]) for o in out) == [1] * 1 + [2] * 4 + [3] * 4
