"""Every collective algorithm against torch.distributed's own, its traffic against its docstring, and no hang
when a peer dies.

Budget (2-core machine, load average 6-10 from other jobs): 47-61 s for one launch of 8 ranks that ran the
whole matrix on a group of each size P = 1..8 in turn (tests/_collective_workers.py; 8 spawned workers,
each importing torch, where one launch per P spawned 36 and took 174-194 s under the same load, 63 s quiet;
the launch now has a 9th rank and runs tests/test_bcube.py's and test_timing.py's checks after the matrix);
the dead-peer cases 0.1-0.8 s each after the first (2-10 s: the forkserver starts), the absent peer ~2 s (its
group's timeout).
"""

from __future__ import annotations

import pytest

from dpcomm.collectives import get, names
from dpcomm.collectives._p2p import block_bounds, chunk_bounds
from dpcomm.costmodel.lp import lp_optimal_block
from dpcomm.costmodel.network import PRESETS, Network, save_network
from dpcomm.errors import UserError
from tests import _collective_workers as W

MINE = {"ring", "lp", "mst", "be", "ps", "native"}


def test_registry_lists_every_algorithm():
    assert MINE | {"noop"} <= set(names())
    with pytest.raises(UserError, match="unknown collective algorithm 'nope'"):
        get("nope")


def test_chunks_and_blocks_cover_the_range():
    for n in (0, 1, 7, 1001):
        for k in (1, 3, 8):
            b = chunk_bounds(n, k)
            sizes = [hi - lo for lo, hi in b]
            assert len(b) == k and b[0][0] == 0 and b[-1][1] == n and max(sizes) - min(sizes) <= 1
            assert all(b[i][1] == b[i + 1][0] for i in range(k - 1))
    assert block_bounds(10, 4, 12) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert block_bounds(3, 8, 1) == [(0, 1), (1, 2), (2, 3)]  # at least one element per block
    assert block_bounds(0, 4, 64) == [(0, 0)]


def test_lp_default_block_is_the_optimum_on_the_network_it_is_told(monkeypatch, tmp_path):
    slow = Network(name="100mbit", alpha=45.26e-6, beta=8e-8)
    monkeypatch.delenv("DPCOMM_NETWORK", raising=False)
    assert get("lp").block_size(16_000_000, 4, "allreduce") == int(
        lp_optimal_block(16_000_000, 4, PRESETS["10gbe"], "allreduce")
    )
    monkeypatch.setenv("DPCOMM_NETWORK", str(save_network(slow, tmp_path / "net.json")))
    b = get("lp").block_size(16_000_000, 4, "allreduce")
    assert b == int(lp_optimal_block(16_000_000, 4, slow, "allreduce")) and 50_000 < b < 60_000
    assert get("lp", network="10gbe").block_size(16_000_000, 4, "allreduce") > 500_000  # explicit wins


@pytest.fixture(scope="module")
def matrix_by_size() -> dict[int, list[dict]]:
    """One launch of 9 ranks (``W.shared_launch``, shared with tests/test_bcube.py and test_timing.py) runs
    the matrix on a group of each size 1..8: {P: one result per member}."""
    by_rank = [r["matrix"] for r in W.shared_launch()]
    return {p: [r[p] for r in by_rank if p in r] for p in range(1, 9)}


@pytest.mark.slow
@pytest.mark.parametrize("world", range(1, 9))
def test_every_algorithm_matches_native(matrix_by_size, world):
    results = matrix_by_size[world]
    assert sorted(r["rank"] for r in results) == list(range(world)), results  # every member reported
    fails = sorted({f for r in results for f in r["fails"]})
    assert not fails, f"{len(fails)} failures on P={world}, first ones:\n" + "\n".join(fails[:15])
    for r in results:
        assert MINE <= set(r["algos"]), r
        assert r["ran"] > 0
        if world in (4, 8):  # BCube(2,2), BCube(2,3): bcube must have run, not been skipped
            assert "bcube" in r["algos"], r


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(MINE | {"bcube"}))
def test_dead_peer_becomes_a_named_error(algo):
    world, victim, timeout_s = 4, 2, 5.0
    out = W.dead_peer(algo, world, victim, timeout_s, deadline_s=4 * timeout_s + 30)
    survivors = set(range(world)) - {victim}
    assert set(out) == survivors, f"ranks that never reported (hang?): {sorted(survivors - set(out))}"
    for rank, (kind, msg, secs) in out.items():
        assert kind == "CollectiveError", (rank, kind, msg)
        assert msg.startswith(f"{algo} allreduce: step "), msg
        assert secs < timeout_s + 10, (rank, secs, msg)  # within the group's timeout (+ slack for load)


@pytest.mark.slow
def test_absent_peer_times_out_with_a_named_error():
    world, victim, timeout_s = 3, 1, 2.0
    out = W.dead_peer("lp", world, victim, timeout_s, deadline_s=4 * timeout_s + 30, absent=True)
    assert set(out) == {0, 2}, f"ranks that never reported (hang?): {sorted({0, 2} - set(out))}"
    for rank, (kind, msg, secs) in out.items():
        assert kind == "CollectiveError" and msg.startswith("lp allreduce: step "), (rank, kind, msg)
        assert timeout_s - 0.5 < secs < timeout_s + 10, (rank, secs, msg)  # it was the group's timeout
