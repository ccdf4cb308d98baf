"""The one registry (:mod:`dpcomm.registry`): each name's implementation and cost formulas side by side.
Budget: imports only."""

from dpcomm import registry
from dpcomm.collectives import get, names
from dpcomm.costmodel import ALGORITHMS


def test_implementations_and_formulas_meet_under_one_name():
    impl = set(names())
    costed = set(ALGORITHMS)
    assert {"ring", "lp", "mst", "be", "bcube", "ps", "native"} <= impl & costed
    assert impl - costed == {"auto", "noop"}  # nothing to price: a chooser and the headroom probe
    assert costed - impl == {"binary_tree", "recursive_doubling"}  # formulas only
    for name in impl | costed:
        e = registry.entry(name)
        assert e is not None and (e.factory is not None) == (name in impl)
        assert (e.cost is not None) == (name in costed) and (e.cost is None or e.cost.name == name)
        assert (e.cost is not None and e.cost.cost_only) == (name not in impl)
    assert type(get("ring")) is registry.entry("ring").factory
    assert ALGORITHMS["ring"] is registry.entry("ring").cost and "nope" not in ALGORITHMS
