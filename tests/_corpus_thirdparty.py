"""Models from other people's libraries, for the third-party tier of ``dpcomm.ddp.wrap`` and
``dpcomm.fsdp.shard`` (issue 54; ``make test-thirdparty``, the ``thirdparty`` extra).

Each is the library's own class built from a tiny config, randomly initialised offline (no hub download:
``HF_HUB_OFFLINE=1``), and trained with the loss a user of that library computes:

- ``gpt2``: Hugging Face ``GPT2LMHeadModel``, a decoder whose ``lm_head`` is tied to the token embedding;
- ``t5``: ``T5ForConditionalGeneration``, an encoder-decoder (shared embedding, relative attention bias in
  the first layer of each stack only);
- ``switch``: ``SwitchTransformersForConditionalGeneration``, top-1 routing to 8 experts, each its own
  module (``experts.expert_{i}``); which experts a rank runs depends on its tokens;
- ``nllb-moe``: ``NllbMoeForConditionalGeneration``, top-2 routing, each expert its own module. Mixtral's
  experts are one module holding 3-D weights in transformers 5 (``MixtralExperts``), as are Qwen-MoE's,
  OLMoE's and JetMoE's; NLLB-MoE and Switch are the two left with a module per expert. (In transformers
  5.23 NLLB-MoE's experts dispatch on ``one_hot(top_1_mask)``, so only ``expert_0`` and ``expert_1`` run:
  the others are parameters no rank uses.)
- ``unet``: diffusers ``UNet2DModel`` (ResNet blocks, self-attention, skip connections, a timestep
  embedding), trained to predict the noise (MSE);
- ``gcn``: torch-geometric's ``GCN`` (two ``GCNConv``, dropout), node classification on each rank's own
  random graph.

:data:`THIRDPARTY` has :data:`tests._corpus.CORPUS`'s shape: a name to ``(build, batch, modes)``;
``batch(seed)`` is one rank's ``(inputs, target)`` with ``inputs`` as ``forward`` takes them (a dict of
keywords for the Hugging Face models, labels included; a tuple for the others). :func:`loss_of` is the
user's loss of ``(output, target)`` and :data:`LOSS_FN` what ``wrap``/``shard`` are given as ``loss_fn``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tests._corpus import ALL_MODES, UNUSED

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # random weights from a config: never the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

VOCAB, DIM, LEN, ROWS = 64, 32, 8, 4
"""Vocabulary, hidden size, tokens per row and rows per rank of the language models."""


def _quiet() -> None:
    """transformers' and diffusers' info and warnings (config defaults, "training mode") off."""
    import transformers

    transformers.logging.set_verbosity_error()


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    _quiet()
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=2 * LEN, n_embd=DIM, n_layer=2, n_head=2, use_cache=False)
    return GPT2LMHeadModel(cfg)


def t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    _quiet()
    cfg = T5Config(
        vocab_size=VOCAB, d_model=DIM, d_kv=DIM // 2, d_ff=2 * DIM, num_layers=1, num_decoder_layers=1,
        num_heads=2, relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0,
        use_cache=False,
    )  # fmt: skip
    return T5ForConditionalGeneration(cfg)


def switch(router_dtype: str = "float32") -> nn.Module:
    from transformers import SwitchTransformersConfig, SwitchTransformersForConditionalGeneration

    _quiet()
    cfg = SwitchTransformersConfig(
        vocab_size=VOCAB, d_model=DIM, d_kv=DIM // 2, d_ff=2 * DIM, num_layers=2, num_decoder_layers=2,
        num_sparse_encoder_layers=1, num_sparse_decoder_layers=1, num_heads=2, num_experts=8,
        expert_capacity=ROWS * LEN, router_dtype=router_dtype, relative_attention_num_buckets=8,
        decoder_start_token_id=0, pad_token_id=0, use_cache=False,
    )  # fmt: skip
    return SwitchTransformersForConditionalGeneration(cfg)


def nllb_moe(router_dtype: str = "float32") -> nn.Module:
    from transformers import NllbMoeConfig, NllbMoeForConditionalGeneration

    _quiet()
    cfg = NllbMoeConfig(
        vocab_size=VOCAB, d_model=DIM, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=2 * DIM, decoder_ffn_dim=2 * DIM, num_experts=4,
        encoder_sparse_step=2, decoder_sparse_step=2, expert_capacity=2 * ROWS * LEN,
        router_dtype=router_dtype, max_position_embeddings=4 * LEN, decoder_start_token_id=2, pad_token_id=1,
        use_cache=False,
    )  # fmt: skip
    return NllbMoeForConditionalGeneration(cfg)


def unet() -> nn.Module:
    from diffusers import UNet2DModel

    return UNet2DModel(
        sample_size=8, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=4, attention_head_dim=8,
    )  # fmt: skip


def gcn() -> nn.Module:
    from torch_geometric.nn import GCN

    return GCN(in_channels=8, hidden_channels=16, num_layers=2, out_channels=4, dropout=0.1)


def _tokens(seed: int, rows: int = ROWS, length: int = LEN, low: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, VOCAB, (rows, length), generator=g)


def _mask(rows: int = ROWS, length: int = LEN) -> torch.Tensor:
    """Row ``i`` padded over its last ``i`` tokens."""
    return (torch.arange(length) < length - torch.arange(rows).unsqueeze(1)).long()


def _causal_lm(seed: int) -> tuple[dict[str, torch.Tensor], None]:
    """``input_ids``, an ``attention_mask`` padding each row's tail, ``labels`` ignoring the padding."""
    ids, mask = _tokens(seed), _mask()
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}, None


def _seq2seq(seed: int) -> tuple[dict[str, torch.Tensor], None]:
    """``input_ids`` with a padded ``attention_mask``, and ``labels`` (the decoder's inputs are made from
    them, shifted right, by the model)."""
    labels = _tokens(seed + 1000, length=6)
    return {"input_ids": _tokens(seed), "attention_mask": _mask(), "labels": labels}, None


def _noisy_images(seed: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``(sample, timestep)`` and the noise to predict."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 8, 8, generator=g)
    return (x, torch.randint(0, 1000, (2,), generator=g)), torch.randn(2, 3, 8, 8, generator=g)


def _graph(seed: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``(x, edge_index)`` of a random undirected graph of 12 nodes, and their classes."""
    g = torch.Generator().manual_seed(seed)
    n = 12
    src, dst = torch.randint(0, n, (2, 24), generator=g)
    edges = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
    return (torch.randn(n, 8, generator=g), edges), torch.randint(0, 4, (n,), generator=g)


THIRDPARTY: dict[str, tuple[Callable[[], nn.Module], Callable[[int], Any], tuple[dict[str, Any], ...]]] = {
    "gpt2": (gpt2, _causal_lm, ALL_MODES),
    "t5": (t5, _seq2seq, ALL_MODES),
    "switch": (switch, _seq2seq, (UNUSED,)),
    "nllb-moe": (nllb_moe, _seq2seq, (UNUSED,)),
    "switch-bf16-router": (functools.partial(switch, "bfloat16"), _seq2seq, (UNUSED,)),
    "nllb-moe-bf16-router": (functools.partial(nllb_moe, "bfloat16"), _seq2seq, (UNUSED,)),
    "unet": (unet, _noisy_images, ALL_MODES),
    "gcn": (gcn, _graph, ALL_MODES),
}


def _field(output: Any, name: str) -> Any:
    return output.get(name) if isinstance(output, dict) else None


def loss_of(output: Any, target: Any) -> torch.Tensor:
    """The user's loss: the model's own (``output.loss``: labels were given), the MSE to the noise of a
    diffusers output's ``sample``, or cross-entropy of a tensor output over its last dimension."""
    loss = _field(output, "loss")
    if loss is not None:
        return loss
    sample = _field(output, "sample")
    if sample is not None:
        return F.mse_loss(sample, target)
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def _own_loss(output: Any) -> torch.Tensor:
    return output["loss"]


LOSS_FN: dict[str, Callable[[Any], torch.Tensor] | None] = {
    name: None if name in ("unet", "gcn") else _own_loss for name in THIRDPARTY
}
"""``loss_fn`` for ``wrap``/``shard``: the model's own loss where it computes one; else their default (the
sum of the output's means: the units and their order are the same)."""
