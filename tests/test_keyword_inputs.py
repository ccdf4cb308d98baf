"""Keyword inputs, as Hugging Face models take them (issue 46, finding 5): ``example=`` as a dict or
``dpcomm.ddp.Inputs(args, kwargs)`` reaches ``forward`` as keywords, outputs may be dicts, ``dpcomm profile
--input NAME=SPEC`` does the same, and a model that cannot run on its ``--input`` is one line, exit 2.
(``wrap`` and ``shard`` on a keyword model with per-rank data: ``tests/test_user_models.py``, ``hf-kw``.)"""

from __future__ import annotations

import sys

import pytest
import torch

from dpcomm.cli.main import main
from dpcomm.ddp import Inputs
from dpcomm.trace import load_trace
from dpcomm.trace.profiler import profile
from dpcomm.utils.user_run import batch_size, call, map_tensors

MOD = "dpcomm_user_kw_t46"
SOURCE = """
import torch
from torch import nn


class HF(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.layer = nn.Linear(8, 8)
        self.classifier = nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask=None, scale=1.0):
        h = self.layer(self.embed(input_ids))
        m = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        return {"logits": self.classifier((h * m.unsqueeze(-1)).sum(1)) * scale, "mask_sum": m.sum()}
"""


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kwmod")
    (folder / f"{MOD}.py").write_text(SOURCE)
    sys.path.insert(0, str(folder))
    import importlib

    yield importlib.import_module(MOD).HF
    sys.path.remove(str(folder))
    sys.modules.pop(MOD, None)


def test_examples_reach_forward_as_a_call_would_pass_them(hf):
    torch.manual_seed(0)
    model = hf()
    ids = torch.randint(0, 50, (4, 6))
    mask = (torch.arange(6) < 4).long().expand(4, 6)
    want = model(ids, attention_mask=mask)["logits"]
    for example in ({"input_ids": ids, "attention_mask": mask}, Inputs((ids,), {"attention_mask": mask})):
        assert torch.equal(call(model, example)["logits"], want)
        assert batch_size(example) == 4
        with torch.device("meta"):
            shapes_only = hf()
        moved = map_tensors(example, lambda t: t.to("meta"))
        assert call(shapes_only, moved)["logits"].device.type == "meta"
    assert not torch.equal(call(model, (ids,))["logits"], want)  # the mask matters: it did reach forward


def test_profile_takes_keyword_inputs_and_dict_outputs(hf):
    model = hf()
    ids = torch.randint(0, 50, (2, 5))
    trace = profile(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, iters=1, warmup=0)
    assert trace.batch_size == 2 and [x.name for x in trace.layers] == ["embed", "layer", "classifier"]


def test_cli_keyword_inputs_and_one_line_errors(hf, tmp_path, capsys):
    out = tmp_path / "t.json"
    argv = ["profile", "--model", f"{MOD}:HF", "--iters", "1", "--warmup", "0"]
    spec = "input_ids=long[3,6]:vocab=50; attention_mask=long[3,6]:vocab=2"
    assert main([*argv, "--input", spec, "-o", str(out)]) == 0
    assert load_trace(out).batch_size == 3
    capsys.readouterr()
    for bad, says in [
        ("attention_mask=long[3,6]:vocab=2", "missing 1 required positional argument: 'input_ids'"),
        ("input_ids=long[3,6]:vocab=50; long[3,6]:vocab=2", "positional inputs come before NAME=SPEC"),
        ("float32[3,6]", "embedding"),  # an embedding of floats: already one line
    ]:
        assert main([*argv, "--input", bad, "-o", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("dpcomm: error:") and "\n" not in err and says in err, err
