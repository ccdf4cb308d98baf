"""Worker functions for tests/test_frameworks.py: a small GPT-2 and a small Llama (transformers configs,
random init) trained through each framework twice from the same weights and random state, once as the
framework trains it and once through :mod:`dpcomm.integrations` (module level: the launcher spawns workers
that import them).

Each run: 3 steps of SGD with momentum 0.9, a shuffled data loader (each rank its own batches, as the
framework shards them), then per rank the step losses, the parameters, the global random state, a
fingerprint for comparing replicas, and what DDP ran: every bucket a recording comm hook saw (its
parameters' names, communication order) and the elements all-reduced per step by every DDP in the module
tree. FSDP2 runs report their units (the modules FSDP2's state says are ``fully_shard``-ed).
"""

from __future__ import annotations

import copy
import tempfile
import traceback
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tests import _user_workers as W

STEPS = 3
LR = 0.05
SAMPLES = 32
BATCH = 4


def build(name: str) -> nn.Module:
    """The model, random init, the same on every rank."""
    import transformers as tf

    torch.manual_seed(0)
    if name == "gpt2":
        cfg = tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32, bos_token_id=0,
                            eos_token_id=0)  # fmt: skip
        return tf.GPT2LMHeadModel(cfg)
    cfg = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=128, max_position_embeddings=32, bos_token_id=0,
                         eos_token_id=0, pad_token_id=0)  # fmt: skip
    return tf.LlamaForCausalLM(cfg)


def dataset() -> list[dict[str, torch.Tensor]]:
    """Token sequences, the labels the inputs (causal LM)."""
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(SAMPLES):
        ids = torch.randint(0, 128, (16,), generator=g)
        out.append({"input_ids": ids, "labels": ids.clone()})
    return out


def loader() -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset(), batch_size=BATCH, shuffle=True)


class Recorder:
    """A recording comm hook (all-reduces as DDP does) and a count of the elements every DDP in a module
    tree all-reduces."""

    def __init__(self) -> None:
        self.buckets: list[list[list[str]]] = []  # per step, the buckets' parameter names
        self.elements = 0

    def attach(self, model: nn.Module) -> None:
        for ddp in [m for m in model.modules() if isinstance(m, DistributedDataParallel)]:
            names = {id(p): n for n, p in ddp.module.named_parameters()}
            ddp.register_comm_hook(None, self._hook(names))

    def step(self) -> None:
        self.buckets.append([])

    def _hook(self, names: dict[int, str]) -> Any:
        def hook(state, bucket):  # no annotations: DDP compares them with the classes, not with strings
            if not self.buckets:
                self.buckets.append([])
            self.buckets[-1].append(sorted(names[id(p)] for p in bucket.parameters()))
            self.elements += bucket.buffer().numel()
            t = bucket.buffer().div_(dist.get_world_size())
            return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])

        return hook


def _result(model: nn.Module, losses: list[float], rec: Recorder | None, info: Any) -> dict[str, Any]:
    params = W._params(model)
    inner = getattr(model, "module", model)
    fsdp = _fsdp_units(inner)
    return {
        "losses": losses,
        "params": {n: t.tolist() for n, t in params.items()},
        "rng": torch.get_rng_state().tolist(),
        "replicas": W._same_on_all_ranks(W._fingerprint(model)),
        "buckets": rec.buckets if rec else [],
        "elements": rec.elements if rec else 0,
        "numel": sum(p.numel() for p in inner.parameters()),
        "groups": info,
        "units": fsdp,
    }


def _fsdp_units(model: nn.Module) -> list[list[str]]:
    """FSDP2's units as its state holds them: the ``fully_shard``-ed modules grouped by the parameter group
    they share (one ``fully_shard`` call each), a module with none its own; sorted."""
    from torch.distributed.fsdp import FSDPModule

    units: dict[int, list[str]] = {}
    for name, m in model.named_modules():
        if isinstance(m, FSDPModule):
            group = m._get_fsdp_state()._fsdp_param_group
            units.setdefault(id(m) if group is None else id(group), []).append(name)
    return sorted(sorted(u) for u in units.values())


def _groups(model: Any) -> list[Any] | None:
    """What dpcomm planned: a DDP's buckets (parameter names, communication order), or the module paths of
    an FSDP2 plan's ``fully_shard`` calls."""
    w = getattr(model, "dpcomm", None)
    if w is None:
        return None
    if hasattr(w, "caps"):
        return [sorted(g) for g in w.caps.param_groups]
    return sorted(sorted(paths) for paths in w.groups.modules)


def _fresh_accelerate_state() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()


# --- Accelerate -----------------------------------------------------------------------------------------


def accelerate_run(case: dict[str, Any]) -> dict[str, Any]:
    from accelerate import Accelerator

    from dpcomm.integrations import accelerate as dpa

    _fresh_accelerate_state()
    model = build(case["model"])
    acc = Accelerator(cpu=True, mixed_precision=case.get("mp", "no"))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    torch.manual_seed(100)
    data = loader()
    if case["dpcomm"]:
        m, o, dl = dpa.prepare(acc, model, opt, data, plan=case["plan"], verify_iters=1, profile_iters=1)
    else:
        m, o, dl = acc.prepare(model, opt, data)
    rec = Recorder()
    rec.attach(m)
    losses = []
    for i, batch in enumerate(dl):
        if i == STEPS:
            break
        rec.step()
        loss = m(**batch).loss
        acc.backward(loss)
        o.step()
        o.zero_grad()
        losses.append(float(loss.detach()))
    return _result(m, losses, rec, _groups(m))


def accelerate_naive(case: dict[str, Any]) -> dict[str, Any]:
    """Finding 1: ``Accelerator.prepare(dpcomm.ddp.wrap(model))``."""
    from accelerate import Accelerator

    from dpcomm.ddp import wrap

    _fresh_accelerate_state()
    model = build(case["model"])
    acc = Accelerator(cpu=True)
    batch = next(iter(loader()))
    ddp = wrap(model, "optimal", example=batch, verify_iters=1, profile_iters=1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    m, o = acc.prepare(ddp, opt)  # dpcomm stops here in one line; before, a second DDP wrapped the first
    rec = Recorder()
    rec.attach(m)
    m(**batch).loss.backward()
    return {"elements": rec.elements, "numel": sum(p.numel() for p in model.parameters())}


# --- the Hugging Face Trainer ----------------------------------------------------------------------------


def _trainer_class(base: type, rec: Recorder) -> type:
    class Recorded(base):  # the DDP the Trainer trains: the model training_step gets
        def training_step(self, model, inputs, *args, **kwargs):
            if not rec.buckets:
                rec.attach(model)
            rec.step()
            return super().training_step(model, inputs, *args, **kwargs)

    return Recorded


def trainer_run(case: dict[str, Any]) -> dict[str, Any]:
    import transformers as tf

    from dpcomm.integrations import hf

    _fresh_accelerate_state()
    model = build(case["model"])
    out = tempfile.mkdtemp(prefix="dpcomm-trainer-")
    args = tf.TrainingArguments(
        output_dir=out, per_device_train_batch_size=BATCH, max_steps=STEPS, use_cpu=True, report_to=[],
        logging_steps=1, save_strategy="no", learning_rate=LR, lr_scheduler_type="constant", optim="sgd",
        seed=0, data_seed=0, disable_tqdm=True,
    )  # fmt: skip
    rec = Recorder()
    if case["dpcomm"]:
        t = _trainer_class(hf.Trainer, rec)(
            model=model, args=args, train_dataset=dataset(), dpcomm_plan=case["plan"],
            dpcomm_options={"verify_iters": 1, "profile_iters": 1},
        )  # fmt: skip
    else:
        t = _trainer_class(tf.Trainer, rec)(model=model, args=args, train_dataset=dataset())
    t.train()
    losses = [h["loss"] for h in t.state.log_history if "loss" in h]
    return _result(t.model_wrapped, losses, rec, _groups(t.model_wrapped))


def trainer_naive(case: dict[str, Any]) -> dict[str, Any]:
    """Finding 2: ``Trainer(model=dpcomm.ddp.wrap(model))``."""
    import transformers as tf

    from dpcomm.ddp import wrap

    _fresh_accelerate_state()
    model = build(case["model"])
    batch = next(iter(loader()))
    ddp = wrap(model, "optimal", example=batch, verify_iters=1, profile_iters=1)
    args = tf.TrainingArguments(output_dir=tempfile.mkdtemp(prefix="dpcomm-trainer-"), max_steps=1,
                                per_device_train_batch_size=BATCH, use_cpu=True, report_to=[],
                                save_strategy="no", disable_tqdm=True)  # fmt: skip
    rec = Recorder()
    t = _trainer_class(tf.Trainer, rec)(model=ddp, args=args, train_dataset=dataset())
    t.train()
    return {"elements": rec.elements, "numel": sum(p.numel() for p in model.parameters())}


# --- Lightning ------------------------------------------------------------------------------------------


def lightning_run(case: dict[str, Any]) -> dict[str, Any]:
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import DDPStrategy, ModelParallelStrategy

    from dpcomm.integrations import lightning as dpl

    rec = Recorder()
    fsdp = case.get("fsdp", False)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = build(case["model"])
            self.losses: list[float] = []
            self.info: Any = None

        def training_step(self, batch, i):
            loss = self.model(**batch).loss
            self.log("loss", loss)
            return loss

        def on_train_batch_start(self, batch, i):
            rec.step()

        def on_train_batch_end(self, outputs, batch, i):
            self.losses.append(float(outputs["loss"].detach()))

        def on_train_start(self):
            rec.attach(self.trainer.strategy.model)
            self.info = _groups(self.trainer.strategy.model)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR, momentum=0.9)

        def train_dataloader(self):
            return loader()

        def configure_model(self):
            if not fsdp:
                return
            if case["dpcomm"]:
                dpl.shard(self, case["plan"], verify_iters=1, profile_iters=1)
                return
            from torch.distributed.fsdp import fully_shard

            group = self.device_mesh["data_parallel"]
            for block in _blocks(self.model):
                fully_shard(block, mesh=group)
            fully_shard(self.model, mesh=group)  # the root: the module training_step calls

    module = Module()
    if fsdp:
        strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    elif case["dpcomm"]:
        strategy = dpl.DDPStrategy(plan=case["plan"], wrap_options={"verify_iters": 1, "profile_iters": 1})
    else:
        strategy = DDPStrategy()
    torch.manual_seed(100)
    trainer = pl.Trainer(
        strategy=strategy, accelerator="cpu", devices=2, max_steps=STEPS, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module)
    r = _result(module, module.losses, rec, _groups(module.model) if fsdp else module.info)
    r["units"] = _fsdp_units(module.model)
    r["text"] = str(getattr(module.model, "dpcomm", ""))
    return r


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The decoder blocks (GPT-2's ``transformer.h``, Llama's ``model.layers``)."""
    for path in ("transformer.h", "model.layers"):
        try:
            return list(model.get_submodule(path))
        except AttributeError:
            continue
    return []


# --- torchtitan -----------------------------------------------------------------------------------------


class _CausalSDPA(nn.Module):
    """In place of torchtitan's flex attention, which has no backward on the CPU ("FlexAttention does not
    support backward on CPU"; its SDPA backend is refused for language models, varlen needs CUDA): causal
    scaled dot-product attention, in the ``(B, L, N, H)`` layout torchtitan's attention module passes."""

    def forward(self, q, k, v, attention_masks=None, scale=None, enable_gqa=False):
        f = nn.functional.scaled_dot_product_attention
        out = f(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True, scale=scale, enable_gqa=enable_gqa)
        return out.transpose(1, 2)


def _titan_llama() -> nn.Module:
    """torchtitan's Llama 3 (its own modules and init), a small config, built on ``meta`` as torchtitan
    builds it; its attention kernel causal SDPA (:class:`_CausalSDPA`), so that it trains on the CPU."""
    from torchtitan.models.common import Embedding, Linear, RMSNorm
    from torchtitan.models.common.rope import ComplexRoPE
    from torchtitan.models.llama3 import (
        _EMBEDDING_INIT,
        _NORM_INIT,
        _build_llama3_layers,
        _output_linear_init,
    )
    from torchtitan.models.llama3.model import Llama3Model

    dim, vocab = 32, 128
    cfg = Llama3Model.Config(
        dim=dim, vocab_size=vocab,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_output_linear_init(dim)),
        layers=_build_llama3_layers(
            n_layers=2, dim=dim, n_heads=2, hidden_dim=64, attn_backend="flex",
            rope=ComplexRoPE.Config(dim=dim // 2, max_seq_len=64, theta=10000, scaling="none"),
        ),
    )  # fmt: skip
    with torch.device("meta"):
        model = cfg.build()
    for block in model.layers.values():
        block.attention.inner_attention = _CausalSDPA()
    return model


def titan_run(case: dict[str, Any]) -> dict[str, Any]:
    """torchtitan's ``parallelize_llama`` (FSDP2 on 2 CPU ranks, float32) or dpcomm's ``planned`` around it,
    then the model materialised and initialised as torchtitan does, and 3 SGD steps on each rank's tokens."""
    import torchtitan.distributed.parallel_dims as pd
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.models.llama3.parallelize import parallelize_llama

    from dpcomm.integrations.torchtitan import planned

    pd.device_type = "cpu"  # torchtitan takes "cuda" where no accelerator is found
    parallelism = ParallelismConfig(spmd_backend="partial_dtensor")  # the plain data-parallel mesh
    dims = pd.ParallelDims.from_config(parallelism, 2)  # dp_shard -1: every rank
    dims.build_mesh()
    training = TrainingConfig(local_batch_size=2, seq_len=16, mixed_precision_param="float32")
    fn = (
        planned(parallelize_llama, case["plan"], verify_iters=1, profile_iters=1)
        if case["dpcomm"]
        else (parallelize_llama)
    )
    model = _titan_llama()
    fn(model, parallel_dims=dims, training=training, parallelism=parallelism,
       compile_config=CompileConfig(), ac_config=None, dump_folder="")  # fmt: skip
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():  # gloo has no PREMUL_SUM: sum, then FSDP2's divide factor (1: torchtitan's)
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_states(buffer_device=None)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    g = torch.Generator().manual_seed(10 + dist.get_rank())  # each rank its own tokens
    losses = []
    for _ in range(STEPS):
        tokens = torch.randint(0, 128, (2, 17), generator=g)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    r = _result(model, losses, None, _groups(model))
    r["text"] = str(getattr(model, "dpcomm", ""))
    return r


RUNS = {
    "accelerate": accelerate_run,
    "accelerate-naive": accelerate_naive,
    "trainer": trainer_run,
    "trainer-naive": trainer_naive,
    "lightning": lightning_run,
    "torchtitan": titan_run,
}


def run_all(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each case in turn on this rank: its result, or its error in one line with the traceback apart."""
    W._start()
    out = []
    for case in cases:
        torch.manual_seed(100)
        try:
            out.append(RUNS[case["run"]](copy.deepcopy(case)))
        except Exception as exc:  # one case's failure is reported, the others still run
            out.append({"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()})
    return out
