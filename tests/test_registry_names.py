"""One name per thing (issue 27): netsim, bench, ``train --collective``, the DDP hooks and the cost model take
their algorithm names from :mod:`dpcomm.registry`, and ``bml``/``bcube`` name one algorithm everywhere.
Budget: pure functions, no worker processes."""

import pytest

from dpcomm import registry
from dpcomm.cli._costargs import cost_algorithm
from dpcomm.cli.bench import config_from_args
from dpcomm.cli.main import command_parser
from dpcomm.collectives import names, resolve
from dpcomm.costmodel import ALGORITHMS, collective_cost, resolve_network
from dpcomm.ddp.hooks import collective_hook
from dpcomm.errors import UserError
from dpcomm.sim.network import FlowModel, make_fabric, simulate_allreduce
from dpcomm.sim.network.algorithms import SCHEDULES, parse_algorithm
from dpcomm.sim.network.fabric import IDEAL

IMPLEMENTED = names()
ALIASES = sorted(registry.ALIASES)


def _bench_algos(text: str) -> tuple[str, ...]:
    args = command_parser("bench").parse_args(["--nproc", "4", "--algos", text])
    return config_from_args(args).algos


def test_an_alias_is_its_algorithm_and_listings_show_the_canonical_name():
    assert registry.ALIASES == {"bml": "bcube"}
    assert registry.entry("bml") is registry.entry("bcube") and registry.resolve("bml") == "bcube"
    assert registry.resolve("nope") is None and registry.entry("nope") is None
    assert "bml" not in IMPLEMENTED and "bml" not in list(ALGORITHMS)  # listed once, by canonical name
    assert "bcube (alias bml)" in registry.describe(IMPLEMENTED)
    with pytest.raises(UserError, match=r"bcube \(alias bml\)"):
        resolve("nope")


@pytest.mark.parametrize("name", [*IMPLEMENTED, *ALIASES])
def test_every_implemented_name_works_in_bench_the_hooks_and_train(name):
    canonical = resolve(name)  # what train/checks.py should call for --collective
    assert _bench_algos(name) == (canonical,)
    hook = collective_hook(name)
    assert hook.__name__ == f"dpcomm_{name}_hook"


@pytest.mark.parametrize("name", [*ALGORITHMS, *ALIASES])
def test_every_priced_name_works_in_the_cost_model_and_plan_simulate(name):
    canonical = cost_algorithm(name)
    assert ALGORITHMS[name] is ALGORITHMS[canonical] and ALGORITHMS[canonical].name == canonical


@pytest.mark.parametrize("name", sorted({*IMPLEMENTED, *ALGORITHMS, *ALIASES}))
def test_netsim_knows_every_registry_name_and_schedules_those_it_can(name):
    """A registry name is never 'unknown' to netsim: it is scheduled, or said to have no flow schedule."""
    canonical = registry.resolve(name)
    if canonical in SCHEDULES:
        assert parse_algorithm(name) == (canonical, None)
    else:
        with pytest.raises(UserError, match="has no flow schedule"):
            parse_algorithm(name)
    assert set(SCHEDULES) <= set(IMPLEMENTED) & set(ALGORITHMS)  # every schedule prices and runs
    assert parse_algorithm("ps-dedicated:2") == ("ps-dedicated", 2)  # a documented option of ps


def test_bml_and_bcube_are_one_algorithm_everywhere():
    model = FlowModel(make_fabric("bcube:3,2", 10e9, IDEAL), alpha_s=1e-6)
    rows = [simulate_allreduce(model, a, 9 << 20)[0] for a in ("bml", "bcube")]
    assert rows[0].time_s == rows[1].time_s > 0 and [r.algorithm for r in rows] == ["bml", "bcube"]
    assert _bench_algos("bml,ring,bcube") == ("bcube", "ring")  # one algorithm, measured once
    net = resolve_network("10gbe")
    costs = {a: collective_cost("allreduce", a, 1 << 20, 9, net, n=3, k=2) for a in ("bml", "bcube")}
    assert costs["bml"] == costs["bcube"] > 0
    assert cost_algorithm("bml") == cost_algorithm("bcube") == "bcube"
    from dpcomm.collectives import get

    assert type(get("bml")) is type(get("bcube")) is registry.entry("bcube").factory  # what the hooks build
