"""What ``dpcomm.ddp.wrap`` and ``dpcomm.fsdp.shard`` promise a user's training run, as code.

Both run the user's model before handing it back (a profile, a ready-order pass, a timed trial), and both
must leave it as plain ``DistributedDataParallel`` / ``fully_shard`` would have: the same parameters,
gradients, buffers, training flags and random state (docs/ddp.md, "What wrap leaves behind").

- :func:`untouched`: a context that snapshots the random state (CPU, and every CUDA device already
  initialised), every module's ``training`` flag, every parameter's ``.grad`` (the tensor itself) and every
  buffer (a copy), and puts them all back on the way out, error or not.
- :func:`nothing_left`: a context for ``wrap`` and ``shard`` themselves: when they refuse (a
  :class:`~dpcomm.errors.UserError`), what they built on the way (a trial's FSDP2 copies and DDPs, in
  reference cycles) goes before the error reaches the user, not at the interpreter's teardown, where
  FSDP2 on gloo ends the job with SIGABRT (issue 54, finding 5; pytorch/pytorch#179291).
- :func:`on_every_rank`: runs a local step and makes its failure everyone's: the ranks exchange their
  one-line errors, and each rank raises the same :class:`~dpcomm.errors.UserError` naming the first rank
  that failed, instead of leaving the others to hang in the next collective.
- :class:`Inputs`, :func:`call`: an ``example`` as a forward takes it: a tensor (``model(x)``), a tuple
  (``model(*example)``), a dict (``model(**example)``, Hugging Face's way) or ``Inputs(args, kwargs)``
  (both); the same in ``wrap``, ``shard`` and ``dpcomm.profile``.
- :func:`check_same_layout`: before ``wrap`` or ``shard`` returns, every rank checks that its buckets
  (units) hold the same parameters (names, shapes, dtypes) in the same order as every other rank's: a DDP
  whose ranks pair different gradients in one all-reduce trains, silently wrong.
- :func:`check_same_weights`: ranks whose initial parameters differ are refused in one line on every rank
  (plain DDP would silently overwrite them with rank 0's; a dpcomm plan profiled on different models is
  not the plan of either).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from dpcomm.errors import UserError, first_line

__all__ = [
    "check_same_layout",
    "check_same_weights",
    "first_param",
    "nothing_left",
    "on_every_rank",
    "rank0_log",
    "tensors_in",
    "untouched",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Inputs:
    """Positional and keyword arguments of one forward: ``model(*args, **kwargs)``."""

    args: tuple[Any, ...] = ()
    """Positional arguments."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments (``input_ids=...``, ``attention_mask=...``)."""


def as_inputs(example: Any) -> Inputs:
    """``example`` as :class:`Inputs`: a tuple is positional, a dict keyword, anything else one argument."""
    if isinstance(example, Inputs):
        return example
    if isinstance(example, tuple):
        return Inputs(args=example)
    if isinstance(example, dict):
        return Inputs(kwargs=dict(example))
    return Inputs(args=(example,))


def call(model: Any, example: Any) -> Any:
    """``model`` run on ``example`` (a tensor, a tuple, a dict of keyword arguments, or :class:`Inputs`)."""
    i = as_inputs(example)
    return model(*i.args, **i.kwargs)


def map_tensors(example: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``example`` with ``fn`` applied to every tensor in it, its shape (tensor, tuple, dict, Inputs) kept."""
    if isinstance(example, torch.Tensor):
        return fn(example)
    if isinstance(example, Inputs):
        return Inputs(args=map_tensors(example.args, fn), kwargs=map_tensors(example.kwargs, fn))
    if isinstance(example, tuple | list):
        return type(example)(map_tensors(x, fn) for x in example)
    if isinstance(example, dict):
        return {k: map_tensors(v, fn) for k, v in example.items()}
    return example


def tensors_in(x: Any, most: int | None = None) -> Iterator[torch.Tensor]:
    """The tensors in ``x``, a tensor or tensors nested in tuples, lists and dicts (a Hugging Face
    ``ModelOutput`` is one), depth first; ``most``: look at that many objects at most."""
    stack, looked = [x], 0
    while stack and (most is None or looked < most):
        o = stack.pop()
        looked += 1
        if isinstance(o, torch.Tensor):
            yield o
        elif isinstance(o, tuple | list):
            stack.extend(o)
        elif isinstance(o, dict):
            stack.extend(o.values())


def batch_size(example: Any) -> int:
    """The first dimension of the first tensor in ``example`` (1 for a scalar or none)."""
    found: list[torch.Tensor] = []
    map_tensors(example, lambda t: found.append(t))
    return int(found[0].shape[0]) if found and found[0].dim() > 0 else 1


def first_param(model: nn.Module, who: str) -> nn.Parameter:
    """The model's first parameter, or a one-line error (every rank sees the same model structure)."""
    p = next(model.parameters(), None)
    if p is None:
        raise UserError(f"{who}: the model has no parameters")
    return p


@contextlib.contextmanager
def untouched(model: nn.Module) -> Iterator[Callable[[], None]]:
    """Run the block, then restore ``model``'s gradients, buffers, training flags and the random state, and
    any parameter's data a forward swapped (a module cast in its own forward: Hugging Face's Switch and
    NLLB-MoE routers run ``self.classifier.to(router_dtype)``; left so, a ``fully_shard`` call would hold
    two dtypes the user's model never had). It yields that last restoration, to call between steps (before
    ``shard`` builds sharded copies from the parameters)."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    params = list(model.parameters())
    grads = [p.grad for p in params]
    data = [p.data for p in params]  # aliases: the storage and dtype as they were, nothing copied
    buffers = [(b, b.detach().clone()) for b in model.buffers() if b.device.type != "meta"]
    modes = [(m, m.training) for m in model.modules()]

    def as_given() -> None:
        for p, d in zip(params, data, strict=True):
            if p.dtype != d.dtype or p.data_ptr() != d.data_ptr() or p.shape != d.shape:
                p.data = d

    with torch.random.fork_rng(devices=devices):
        try:
            yield as_given
        finally:
            as_given()
            for p, g in zip(params, grads, strict=True):
                p.grad = g
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)
            for m, training in modes:
                m.training = training


@contextlib.contextmanager
def nothing_left() -> Iterator[None]:
    """On a :class:`UserError` (a refusal: one line, no traceback shown), drop the tracebacks of it and of the
    exceptions it was raised from (their frames hold what the refused call built) and collect the cycles
    now; then re-raise. Other exceptions pass as they are, tracebacks and all."""
    import gc

    try:
        yield
    except UserError as exc:
        seen: Any = exc
        while seen is not None:
            seen.__traceback__ = None
            seen = seen.__cause__ or seen.__context__
        del seen, exc
        gc.collect()
        raise


def on_every_rank(step: Callable[[], T], group: Any, what: str) -> T:
    """``step()`` on this rank; if it raised on any rank, every rank raises one :class:`UserError` saying
    ``what`` failed, on which rank first, and why (its first line)."""
    error = ""
    result: Any = None
    try:
        result = step()
    except UserError as exc:
        error = str(exc)
    except Exception as exc:  # a user's model failing on the example: quoted, not a traceback
        error = first_line(exc, with_type=True)
    errors: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(errors, error, group=group)
    bad = [r for r, e in enumerate(errors) if e]
    if bad:
        more = f" (and on rank {', '.join(map(str, bad[1:]))})" if len(bad) > 1 else ""
        raise UserError(f"{what} failed on rank {bad[0]}{more}: {errors[bad[0]]}")
    return result


def _digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        if p.device.type == "meta":
            h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
            continue
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.to_local()
        h.update(name.encode())
        h.update(t.contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def check_same_weights(model: nn.Module, group: Any, who: str) -> None:
    """Refuse, on every rank in one line, ranks whose parameters differ (names, shapes or values)."""
    digests: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(digests, _digest(model), group=group)
    odd = [r for r, d in enumerate(digests) if d != digests[0]]
    if odd:
        raise UserError(
            f"{who}: rank(s) {', '.join(map(str, odd))} hold other initial weights than rank 0; build the "
            "model from the same seed on every rank (torch.manual_seed before constructing it)"
        )


def check_same_layout(model: nn.Module, layout: Any, group: Any, who: str, what: str = "buckets") -> None:
    """Refuse, on every rank in one line, ranks whose ``layout`` (per bucket or unit, in communication or
    call order: parameter names, or module paths and names) differs from rank 0's, parameters' shapes and
    dtypes included; one ``all_gather_object`` of a sha256."""
    params = dict(model.named_parameters())
    h = hashlib.sha256()
    for k, entries in enumerate(layout):
        h.update(f"[{k}]".encode())
        for n in entries:
            p = params.get(n)
            h.update(f"{n}:{'' if p is None else (tuple(p.shape), p.dtype)};".encode())
    digests: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(digests, h.hexdigest(), group=group)
    odd = [r for r, d in enumerate(digests) if d != digests[0]]
    if odd:
        raise UserError(
            f"{who}: rank(s) {', '.join(map(str, odd))} would run other {what} (parameters, shapes, dtypes "
            "or order) than rank 0; nothing was built (a dpcomm bug: please report it with the model)"
        )


def rank0_log(logger: logging.Logger, message: str, group: Any = None) -> None:
    """``logger.info(message)`` on the group's rank 0 only."""
    if dist.get_rank(group) == 0:
        logger.info(message)
