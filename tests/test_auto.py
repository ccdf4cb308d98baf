"""``auto``: the cost model's argmin, the same on every rank, bcube only when asked for. No workers."""

from __future__ import annotations

import pytest

from dpcomm.collectives import get
from dpcomm.collectives.auto import CANDIDATES, choose
from dpcomm.costmodel import PRESETS, Network
from dpcomm.costmodel.collective import collective_cost

NET = PRESETS["10gbe"]


@pytest.mark.parametrize("op", ["allreduce", "broadcast", "reduce"])
@pytest.mark.parametrize("nodes", [2, 3, 4, 8, 9])
def test_choice_is_the_cheapest_formula(op, nodes):
    for nbytes in (4, 1024, 65536, 1 << 20, 64 << 20):
        best, costs = choose(op, nbytes, nodes, NET)
        assert set(costs) == set(CANDIDATES)
        brute = {a: collective_cost(op, a, nbytes, nodes, NET) for a in CANDIDATES}
        assert costs == pytest.approx(brute) and brute[best] == min(brute.values())


def test_choice_follows_the_network():
    # latency-bound network: the tree (fewest messages) wins; bandwidth-bound: a bandwidth-optimal one
    slow_start = Network(name="lat", alpha=1e-3, beta=1e-12)
    fat_pipe = Network(name="bw", alpha=1e-9, beta=1e-8)
    assert choose("broadcast", 1 << 20, 8, slow_start)[0] == "mst"
    assert choose("broadcast", 1 << 20, 8, fat_pipe)[0] in ("lp", "be", "ring", "ps")


def test_bcube_only_when_asked_and_p_fits():
    assert "bcube" not in choose("allreduce", 1 << 20, 9, NET)[1]
    assert "bcube" in choose("allreduce", 1 << 20, 9, NET, ("ring", "bcube"))[1]
    assert "bcube" not in choose("allreduce", 1 << 20, 6, NET, ("ring", "bcube"))[1]


def test_network_from_env(monkeypatch, tmp_path):
    f = tmp_path / "n.json"
    f.write_text('{"format": "dpcomm-network/1", "alpha_s": 1e-3, "beta_s_per_byte": 1e-12}')
    monkeypatch.setenv("DPCOMM_NETWORK", str(f))
    assert get("auto").net.alpha == 1e-3
    assert get("auto", network="10gbe").net == NET
