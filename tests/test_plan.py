"""Plan is plain data: contiguous groups covering every layer in backward (communication) order."""

import pytest

from dpcomm.plan import Plan


def test_from_sizes_and_round_trip():
    p = Plan.from_sizes("x", [3, 1], 4, nodes=8)
    assert p.groups == ((1, 2, 3), (0,))
    assert p.meta == {"nodes": 8}
    q = Plan.from_dict(p.to_dict())
    assert q == p and q.sha256() == p.sha256()
    assert Plan.from_sizes("x", [1, 3], 4).sha256() != p.sha256()


@pytest.mark.parametrize(
    "groups",
    [
        [[0, 1], [2, 3]],  # forward order, not communication order
        [[2, 3], [1]],  # layer 0 missing
        [[1, 3], [0, 2]],  # not contiguous
        [[3], [], [0, 1, 2]],  # empty group
        [[3, 2], [1, 0]],  # descending inside a group
    ],
)
def test_invalid_groups_rejected(groups):
    with pytest.raises(ValueError):
        Plan(schedule="bad", num_layers=4, groups=groups)
