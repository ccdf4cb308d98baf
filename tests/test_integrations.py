"""The framework integrations' pieces that need no framework (:mod:`dpcomm.integrations`, issue 55): the
example batch taken without changing what a loader then yields or the random state, the DDP door opened only
around a framework's preparation, the loss of a step's output, and the torchtitan adapter's one-line
refusals. The integrations themselves train in the frameworks tier (tests/test_frameworks.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from dpcomm.errors import UserError
from dpcomm.integrations._common import first_batch, planned_ddp, step_loss, to_device
from dpcomm.integrations.torchtitan import FSDP_STEP, planned


def _loader(generator: torch.Generator | None = None) -> torch.utils.data.DataLoader:
    data = [{"x": torch.tensor([i])} for i in range(12)]
    return torch.utils.data.DataLoader(data, batch_size=3, shuffle=True, generator=generator)


@pytest.mark.parametrize("own_generator", [False, True])
def test_the_first_batch_leaves_the_epoch_and_every_random_state_as_they_were(own_generator):
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    gen = torch.Generator().manual_seed(5) if own_generator else None
    loader = _loader(gen)
    states = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    saved = gen.get_state() if gen is not None else None
    batch = first_batch(loader)
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert (np.random.get_state()[1] == states[2]).all()
    if gen is not None:
        assert torch.equal(gen.get_state(), saved)
    epoch = [b["x"].tolist() for b in loader]
    assert batch["x"].tolist() == epoch[0]  # the batch the epoch starts with
    torch.set_rng_state(states[0])
    if gen is not None:
        gen.set_state(saved)
    assert [b["x"].tolist() for b in _loader(gen)] == epoch  # the epoch it would have run


def test_an_empty_loader_is_one_line():
    with pytest.raises(UserError, match="yields no batch"):
        first_batch(torch.utils.data.DataLoader([], batch_size=2))


def test_the_ddp_door_is_open_only_inside_the_block_and_closed_while_it_builds():
    stock = torch.nn.parallel.DistributedDataParallel
    seen = []

    def build(module, *args, **kwargs):
        seen.append((module, args, kwargs, torch.nn.parallel.DistributedDataParallel is stock))
        return "built"

    with planned_ddp(build):
        assert torch.nn.parallel.DistributedDataParallel is not stock
        got = torch.nn.parallel.DistributedDataParallel("model", device_ids=None, find_unused_parameters=True)
        assert torch.nn.parallel.DistributedDataParallel is not stock  # open again after the build
    assert got == "built" and torch.nn.parallel.DistributedDataParallel is stock
    assert seen == [("model", (), {"device_ids": None, "find_unused_parameters": True}, True)]
    with pytest.raises(RuntimeError), planned_ddp(build):
        raise RuntimeError("a failed prepare")
    assert torch.nn.parallel.DistributedDataParallel is stock


def test_a_steps_loss_and_a_mapping_batch():
    loss = torch.tensor(2.0, requires_grad=True)
    assert step_loss(loss) is loss and step_loss({"loss": loss, "logits": torch.ones(2)}) is loss

    class Output:  # a Hugging Face output has .loss
        pass

    out = Output()
    out.loss = loss
    assert step_loss(out) is loss
    x = torch.ones(3, requires_grad=True)
    assert float(step_loss((x * 2,))) == 2.0  # no loss: the floating outputs' means
    from collections import UserDict

    batch = to_device(UserDict({"input_ids": torch.ones(2)}), torch.nn.Linear(2, 2))
    assert type(batch) is dict and set(batch) == {"input_ids"}  # BatchEncoding is a UserDict


def _titan_like(**step_kw):
    """A parallelize_fn in a module of its own whose FSDP2 step is torchtitan's name."""
    names = {FSDP_STEP: lambda model, mesh, **kw: None, "torch": torch}
    exec(
        f"def parallelize(model, **kw):\n    {FSDP_STEP}(model, None, **{step_kw!r})\n    return model", names
    )
    return names["parallelize"]


def test_the_torchtitan_adapter_refuses_what_it_cannot_plan_in_one_line():
    with pytest.raises(UserError, match="does not call torchtitan's apply_fsdp_to_decoder"):
        planned(lambda model, **kw: model)
    base = {"param_dtype": torch.float32, "reduce_dtype": torch.float32}
    for kw, words in (
        ({"pp_enabled": True}, "pipeline parallelism"),
        ({"ep_degree": 2}, "expert parallelism"),
        ({"dp_mesh_dims": "dims"}, 'spmd_backend = "partial_dtensor"'),
    ):
        fn = _titan_like(**base, **kw)
        with pytest.raises(UserError, match=words) as err:
            planned(fn, "optimal", example=torch.zeros(1))(torch.nn.Linear(2, 2))
        assert "\n" not in str(err.value)
        assert fn.__globals__[FSDP_STEP].__name__ == "<lambda>"  # torchtitan's step put back
