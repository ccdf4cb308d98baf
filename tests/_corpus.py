"""Models as people write them, for the tests of ``dpcomm.ddp.wrap`` and ``dpcomm.fsdp.shard`` (issue 36).

Each is small enough to train a few steps on 2-3 gloo workers in well under a second, and each carries one
thing our zoo does not: PyTorch's own ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer``
(``MultiheadAttention`` never calls its ``out_proj``'s forward), attention on ``qkv.split`` with
``scaled_dot_product_attention``, a tied embedding, modules registered in another order than they run,
experts a fixed routing never uses, a LoRA-style frozen backbone, one module used twice, nested
``ModuleDict`` s, BatchNorm (buffers DDP broadcasts) and dropout (random state the wrappers must not eat);
issue 46's: data-dependent routing, per-rank tasks, keyword inputs, a frozen backbone, one block applied 4
times, activation checkpointing, a counter buffer updated in forward, bf16 linears beside fp32 norms
(:class:`MixedDtypes`: ``wrap`` runs a bucket per dtype, ``shard`` refuses it in one line).

:data:`CORPUS` maps a name to ``(build, batch, modes)``: ``build()`` makes the model (call it under
``torch.manual_seed``), ``batch(seed)`` one rank's ``(inputs, targets)``, ``modes`` the DDP keyword sets a
user of that model can run with plain DDP (a model with parameters no forward uses needs
``find_unused_parameters`` or ``static_graph``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, CTX = 32, 16, 8

DEFAULT: dict[str, Any] = {}
UNUSED = {"find_unused_parameters": True}
STATIC = {"static_graph": True}
ALL_MODES = (DEFAULT, UNUSED, STATIC)
"""DDP keyword sets: its default, ``find_unused_parameters=True`` and ``static_graph=True``."""


class EncoderClassifier(nn.Module):
    """Token embedding, two ``nn.TransformerEncoderLayer`` (dropout on), mean pooling, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        layer = nn.TransformerEncoderLayer(DIM, 2, 2 * DIM, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, 4)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(idx)).mean(dim=1))


class TorchDecoder(nn.Module):
    """Two ``nn.TransformerDecoderLayer`` attending to the embedded input itself, causal, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(
            nn.TransformerDecoderLayer(DIM, 2, 2 * DIM, dropout=0.1, batch_first=True) for _ in range(2)
        )
        self.out = nn.Linear(DIM, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = mem = self.embed(idx)
        mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1])
        for layer in self.layers:
            x = layer(x, mem, tgt_mask=mask, tgt_is_causal=True)
        return self.out(x)


class _SdpaBlock(nn.Module):
    """Pre-norm block, attention on ``qkv.split`` through SDPA; the MLP registered before the attention."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM), nn.Dropout(0.1))
        self.ln_1, self.ln_2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(DIM, dim=2)
        q, k, v = (z.view(b, t, 2, DIM // 2).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1 if self.training else 0.0)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, DIM))
        return x + self.mlp(self.ln_2(x))


class SdpaGPT(nn.Module):
    """A user's 4-block decoder: tied embedding, a frozen final LayerNorm, an unused classification head,
    the head and the output projection registered before the blocks (not in the order they run)."""

    def __init__(self, blocks: int = 4) -> None:
        super().__init__()
        self.cls_head = nn.Linear(DIM, 3)  # never used by forward
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.wte, self.wpe = nn.Embedding(VOCAB, DIM), nn.Embedding(CTX, DIM)
        self.lm_head.weight = self.wte.weight  # tied: used first and last
        self.drop = nn.Dropout(0.1)
        self.h = nn.ModuleList(_SdpaBlock() for _ in range(blocks))
        self.ln_f = nn.LayerNorm(DIM).requires_grad_(False)  # frozen

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device)))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class FixedMoE(nn.Module):
    """An MLP with four experts; the routing sends token ``i`` to expert ``i % 3``, so expert 3 never runs
    (a static set of unused parameters, as DDP's ``static_graph`` requires); the gate weighs each output."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, DIM)
        self.gate = nn.Linear(DIM, 4)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU()) for _ in range(4))
        self.out = nn.Linear(DIM, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        w = self.gate(h).softmax(-1)
        route = torch.arange(h.shape[0], device=h.device) % 3
        y = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            pick = (route == e).nonzero().flatten()
            if pick.numel():
                y = y.index_add(0, pick, expert(h[pick]) * w[pick, e : e + 1])
        return self.out(h + y)


class _LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update ``B A``."""

    def __init__(self, d_in: int, d_out: int, rank: int = 2) -> None:
        super().__init__()
        self.base = nn.Linear(d_in, d_out).requires_grad_(False)
        self.lora_a = nn.Parameter(torch.randn(rank, d_in) * 0.1)
        self.lora_b = nn.Parameter(torch.randn(d_out, rank) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.lora_a.t() @ self.lora_b.t()


class LoRA(nn.Module):
    """A frozen 3-layer backbone with LoRA adapters and a trainable head."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(_LoRALinear(DIM, DIM) for _ in range(3)))
        self.head = nn.Linear(DIM, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.layers(x)))


class SharedTwice(nn.Module):
    """One block applied twice (weight sharing across depth), with a dropout between."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, DIM)
        self.block = nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh())
        self.drop = nn.Dropout(0.1)
        self.out = nn.Linear(DIM, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.block(self.drop(self.block(self.inp(x)))))


class _AlbertBlock(nn.Module):
    """Pre-norm block: a token-mixing linear and an MLP, each a residual (its linears run on 3-D inputs: their
    outputs are views, so ``shard`` gives their parameters to the block)."""

    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + torch.tanh(self.attn(self.ln_1(x)))
        return x + self.mlp(self.ln_2(x))


class SharedBlocks(nn.Module):
    """ALBERT-style cross-layer sharing (Lan et al. 2020): one block applied ``n`` times between a token
    embedding and a pooled head."""

    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.n = n
        self.embed = nn.Embedding(VOCAB, DIM)
        self.block = _AlbertBlock()
        self.head = nn.Linear(DIM, 4)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for _ in range(self.n):
            x = self.block(x)
        return self.head(x.mean(dim=1))


class Checkpointed(nn.Module):
    """Activation checkpointing: two residual MLP blocks each run under ``torch.utils.checkpoint`` (their
    forward runs again in backward), a head."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, DIM)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(DIM), nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
            for _ in range(2)
        )
        self.out = nn.Linear(DIM, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        h = self.inp(x)
        for block in self.blocks:
            h = h + checkpoint(block, h, use_reentrant=False)
        return self.out(h)


class Counting(nn.Module):
    """A buffer updated in forward: a step counter (``count += 1`` per forward in training) that scales the
    hidden state, so an extra forward the wrappers ran and left counted would change the losses."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))
        self.fc1, self.fc2 = nn.Linear(DIM, DIM), nn.Linear(DIM, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.count += 1
        return self.fc2(torch.relu(self.fc1(x)) / (1 + 0.1 * self.count))


class MixedDtypes(nn.Module):
    """bf16 linears and fp32 LayerNorms (a model cast piecewise, as mixed-precision recipes keep norms in
    fp32); the output in fp32."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(DIM, DIM).bfloat16(), nn.Linear(DIM, 4).bfloat16()
        self.norm = nn.LayerNorm(DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(torch.relu(self.fc1(x.bfloat16())).float())
        return self.fc2(h.bfloat16()).float()


class NestedDict(nn.Module):
    """Parameters two ``ModuleDict`` s deep, run in another order than registered."""

    def __init__(self) -> None:
        super().__init__()
        self.parts = nn.ModuleDict(
            {
                "head": nn.ModuleDict({"fc": nn.Linear(DIM, 4)}),
                "body": nn.ModuleDict({"b": nn.Linear(DIM, DIM), "a": nn.Linear(DIM, DIM)}),
            }
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        body = self.parts["body"]
        return self.parts["head"]["fc"](torch.relu(body["b"](torch.relu(body["a"](x)))))


class BNConv(nn.Module):
    """Two convolutions with BatchNorm (running statistics: buffers DDP broadcasts), pooling, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
            nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )  # fmt: skip
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class HFStyle(nn.Module):
    """As Hugging Face models take and give them: ``model(input_ids=..., attention_mask=...)`` returning a
    dict (``logits`` and the pooled ``hidden`` state); padding masked out of the mean."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layer = nn.Sequential(nn.Linear(DIM, DIM), nn.GELU())
        self.classifier = nn.Linear(DIM, 4)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict[str, Any]:
        h = self.layer(self.embed(input_ids))
        m = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        pooled = (h * m.unsqueeze(-1)).sum(1) / m.sum(1, keepdim=True).clamp(min=1)
        return {"logits": self.classifier(pooled), "hidden": pooled}


def _hf_batch(seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Keyword inputs: ``input_ids`` and an ``attention_mask`` padding each row's tail."""
    x, y = _tokens(4)(seed)
    mask = (torch.arange(CTX) < CTX - torch.arange(4).unsqueeze(1)).long()
    return {"input_ids": x, "attention_mask": mask}, y


class FrozenBackbone(nn.Module):
    """A frozen 4-layer MLP backbone (``requires_grad_(False)``: fine-tuning only the head) and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(*(nn.Linear(DIM, DIM) for _ in range(4))).requires_grad_(False)
        self.head = nn.Linear(DIM, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.backbone(x)))


class StemBackboneHead(nn.Module):
    """A frozen stem and backbone (``nn.Linear(64, 64)``: 16,640 bytes each) and a trained head (520 bytes):
    with the frozen modules units of their own it fits 20,000 bytes unsharded (issue 54, item 6)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(64, 64).requires_grad_(False)
        self.backbone = nn.Linear(64, 64).requires_grad_(False)
        self.head = nn.Linear(64, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.backbone(torch.relu(self.stem(x)))))


class HashMoE(nn.Module):
    """Token embedding, then a mixture of ``experts`` MLPs with data-dependent top-``k`` routing: token ``t``
    goes to experts ``(t + j s) % experts`` for ``j < k``, ``s = experts // k`` (hash routing, Roller et al.
    2021), weighed by a
    learnt gate's softmax over them; mean pooling and a head. Which experts a batch uses depends on its
    tokens: with :func:`_domain_tokens`, rank 0's batch routes to other experts than rank 1's."""

    def __init__(self, k: int = 1, experts: int = 2) -> None:
        super().__init__()
        self.k, self.n = k, experts
        self.embed = nn.Embedding(VOCAB, DIM)
        self.gate = nn.Linear(DIM, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU()) for _ in range(experts))
        self.head = nn.Linear(DIM, 4)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx).flatten(0, 1)
        tok = idx.flatten()
        route = torch.stack(
            [(tok + j * (self.n // self.k)) % self.n for j in range(self.k)], dim=1
        )  # (tokens, k)
        w = self.gate(h).gather(1, route).softmax(-1)
        y = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            rows, slot = (route == e).nonzero(as_tuple=True)
            if rows.numel():
                y = y.index_add(0, rows, expert(h[rows]) * w[rows, slot].unsqueeze(1))
        return self.head((h + y).view(*idx.shape, DIM).mean(dim=1))


class SwitchMoE(nn.Module):
    """Switch Transformer's feed-forward (Fedus et al. 2021): a learnt router picks one of ``experts`` MLPs
    per token (top-1, argmax of its logits; the expert's output scaled by the router's probability), one
    module per expert, between a token embedding and a pooled head. Which experts run is decided by the
    router on the data, so it changes with the batch and differs across ranks; with 16 experts and 16 tokens
    a rank (:func:`_switch_tokens`), about two experts a step are used by no rank."""

    def __init__(self, experts: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.router = nn.Linear(DIM, experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.ReLU(), nn.Linear(2 * DIM, DIM)) for _ in range(experts)
        )
        self.head = nn.Linear(DIM, 4)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx).flatten(0, 1)
        prob = self.router(h).softmax(-1)
        top, pick = prob.max(-1)
        y = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            rows = (pick == e).nonzero().flatten()
            if rows.numel():
                y = y.index_add(0, rows, expert(h[rows]) * top[rows].unsqueeze(1))
        return self.head((h + y).view(*idx.shape, DIM).mean(dim=1))


class TaskHeads(nn.Module):
    """Multi-task: a shared trunk and a ``ModuleDict`` of heads; the batch's first token names its task (a
    task prefix, as T5's), so a rank whose data is one task trains only that task's head."""

    TASKS = ("sentiment", "topic", "language")

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.trunk = nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU())
        self.heads = nn.ModuleDict({t: nn.Linear(DIM, 4) for t in self.TASKS})

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        task = self.TASKS[int(idx[0, 0]) % len(self.TASKS)]
        return self.heads[task](self.trunk(self.embed(idx[:, 1:]).mean(dim=1)))


def _domain_tokens(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One rank's batch from its own domain: every token ``= seed (mod 2)`` (rank 0's even, rank 1's odd,
    with seeds ``10 + rank``: top-1 over 2 experts, rank 0 runs expert 0 only, rank 1 expert 1 only), and
    every row's first token ``seed % 6`` (a task prefix ``seed % 3``: each rank its own task)."""
    g = torch.Generator().manual_seed(seed)
    x = 2 * torch.randint(0, VOCAB // 2, (4, CTX), generator=g) + seed % 2
    x[:, 0] = seed % 6
    return x, torch.randint(0, 4, (4,), generator=g)


def _tokens(classes: int | None) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randint(0, VOCAB, (4, CTX + 1), generator=g)
        if classes is None:  # next-token prediction
            return x[:, :-1], x[:, 1:]
        return x[:, :-1], torch.randint(0, classes, (4,), generator=g)

    return batch


def _switch_tokens(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of tokens, a class each (16 tokens: few enough that some experts go unpicked)."""
    x, y = _tokens(4)(seed)
    return x[:2], y[:2]


def _wide(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 64, generator=g), torch.randint(0, 2, (8,), generator=g)


def _vectors(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, DIM, generator=g), torch.randint(0, 4, (6,), generator=g)


def _images(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 1, 8, 8, generator=g), torch.randint(0, 4, (4,), generator=g)


def _zoo_gpt2() -> nn.Module:
    from dpcomm.models import get_model

    return get_model("gpt2-tiny")


def _gpt2_tokens(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (2, 33), generator=g)
    return x[:, :-1], x[:, 1:]


CORPUS: dict[str, tuple[Callable[[], nn.Module], Callable[[int], Any], tuple[dict[str, Any], ...]]] = {
    "encoder": (EncoderClassifier, _tokens(4), ALL_MODES),
    "decoder": (TorchDecoder, _tokens(None), ALL_MODES),
    "sdpa-gpt": (SdpaGPT, _tokens(None), (UNUSED, STATIC)),
    "moe": (FixedMoE, _vectors, (UNUSED, STATIC)),
    "lora": (LoRA, _vectors, ALL_MODES),
    "shared": (SharedTwice, _vectors, ALL_MODES),
    "nested": (NestedDict, _vectors, ALL_MODES),
    "bn": (BNConv, _images, ALL_MODES),
    "frozen": (FrozenBackbone, _vectors, (DEFAULT,)),
    "hf-kw": (HFStyle, _hf_batch, (DEFAULT,)),
    "moe-top1": (HashMoE, _domain_tokens, (UNUSED,)),
    "moe-top2": (lambda: HashMoE(k=2, experts=4), _domain_tokens, (UNUSED,)),
    "tasks": (TaskHeads, _domain_tokens, (UNUSED,)),
    "switch": (SwitchMoE, _switch_tokens, (UNUSED,)),
    "frozen-stem": (StemBackboneHead, _wide, (DEFAULT,)),
    "shared-4": (SharedBlocks, _tokens(4), (DEFAULT,)),
    "checkpoint": (Checkpointed, _vectors, (DEFAULT,)),
    "counter": (Counting, _vectors, (DEFAULT,)),
    "mixed": (MixedDtypes, _vectors, ALL_MODES),
}

ZOO = {"gpt2-tiny": (_zoo_gpt2, _gpt2_tokens, ALL_MODES)}
"""The zoo's GPT-2 (tied ``lm_head``), for the FSDP budget finding of issue 36."""


def loss_of(output: Any, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the last dimension (classes or vocabulary); a dict output's ``logits``."""
    output = output["logits"] if isinstance(output, dict) else output
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
