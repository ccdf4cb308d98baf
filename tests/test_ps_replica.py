"""The parameter server as the training layer's ``ps`` kind (skipped where the training layer is absent).

Both placements run through the one training loop: co-located (every rank a worker) and dedicated servers
(``servers=S``: ``S`` server ranks after the workers). Two launches: 3 processes run two schedules side by
side and then a checkpointed co-located run, 5 resume the rest of it with two dedicated servers.
"""

import json

import pytest

replica = pytest.importorskip("dpcomm.train.replica", reason="the training layer (dpcomm.train) is not here")

from dpcomm.errors import UserError  # noqa: E402
from dpcomm.ps.spec import PsSpec  # noqa: E402


def test_ps_kind_is_registered_and_checks_its_schedule():
    kinds = replica.kinds()
    assert "ps" in kinds
    assert replica.kind_of("ps:ibatch").name == "ps"
    from dpcomm.train.config import TrainConfig

    cfg = TrainConfig(model="lenet5", nproc=3, data="digits", iters=4, batch_size=8)
    assert replica.check_schedule(cfg, "ps:optimal,sparsify=topk:0.1") == PsSpec(pull="optimal", sparsify=0.1)
    assert replica.server_ranks("ps:all,servers=2", replica.check_schedule(cfg, "ps:all,servers=2")) == 2
    assert replica.server_ranks("mgwfbp", replica.check_schedule(cfg, "mgwfbp")) == 0
    for bad in ("ps:greedy", "ps:all,servers=0", "ps:all,sparsify=topk:2"):
        with pytest.raises(UserError):
            replica.check_schedule(cfg, bad)


@pytest.mark.slow
def test_ps_trains_like_allreduce_and_resumes_bitwise(tmp_path):
    from dpcomm.train import TrainConfig, train
    from tests._train_workers import train_runs

    cfg = TrainConfig(model="lenet5", nproc=3, data="digits", iters=4, batch_size=8, progress=False)
    ck, trace = str(tmp_path / "ck"), tmp_path / "trace.json"
    # (two iterations either side of the checkpoint: a run's first iteration, resumed or not, pulls nothing
    # and its second trains on pulled parameters; the checkpoint carries the servers' momentum of two steps)
    half = TrainConfig(model="lenet5", nproc=3, data="digits", iters=2, batch_size=8, progress=False,
                       schedule="ps:layer", checkpoint=ck)  # fmt: skip
    # the comparison and the first half share a launch (tests/_train_workers.py: both co-located)
    (single, *pss), _ = train_runs([(cfg, ["single", "ps:ibatch,pulls=request"]), (half, None)])
    # (every pull method and mode against all-reduce SGD: tests/test_ps.py, without the loop)
    for ps in pss:
        assert len(set(ps.params_sha256)) == 1  # every worker bitwise the same
        assert ps.loss_final == pytest.approx(single.loss_final, rel=1e-5)  # float sums in another order
        assert ps.test_accuracy == pytest.approx(single.test_accuracy, abs=0.01)
    # both placements through the same loop: half the run co-located, checkpointed, then resumed with two
    # dedicated servers (the checkpoint is in state_dict form, whoever held the shards); the same parameters
    # and loss as the uninterrupted co-located run, the same JSON keys, a Chrome trace with the servers in it
    more = {"iters": 4, "resume": True, "chrome_trace": str(trace), "schedule": "ps:layer,servers=2"}
    resumed = train(TrainConfig(**{**_fields(half), **more}))
    assert resumed.start_iteration == 2 and resumed.nproc == 3
    assert resumed.params_sha256 == pss[0].params_sha256  # bitwise: placement and resume change nothing
    assert resumed.loss_final == pss[0].loss_final and resumed.test_accuracy == pss[0].test_accuracy
    assert set(resumed.to_json()) == set(pss[0].to_json())
    names = {e["args"]["name"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "M"}
    assert {"rank 0", "rank 2", "server rank 3", "server rank 4"} <= names, names


def _fields(cfg):
    from dataclasses import fields

    return {f.name: getattr(cfg, f.name) for f in fields(cfg)}
