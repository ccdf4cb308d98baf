"""What the framework integrations share: DDP built by ``wrap`` where a framework builds its own, the example
batch taken from the framework's training data without changing what it yields after, and the loss of a
Hugging Face or Lightning step.

``planned_ddp(build)``: while it is open, ``torch.nn.parallel.DistributedDataParallel(module, ...)`` is
``build(module, ...)``. Accelerate builds DDP by that name (``Accelerator.prepare_model``, accelerate
1.16, after its device placement and mixed-precision forward, before its comm hook and compile), so the
framework keeps every step of its own around the one dpcomm changes. Open only around a framework's model
preparation, on one thread; ``isinstance`` against the name inside the window sees the door class, which no
DDP is, so frameworks that test a model for DDP there would not find it (accelerate 1.16 does not).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from dpcomm.errors import UserError
from dpcomm.utils.user_run import map_tensors

__all__ = ["first_batch", "kept_random", "planned_ddp", "step_loss", "to_device"]


@contextlib.contextmanager
def planned_ddp(build: Callable[..., nn.Module]) -> Iterator[None]:
    """``torch.nn.parallel.DistributedDataParallel(module, *args, **kw)`` returns ``build(module, *args,
    **kw)`` inside the block (module docstring)."""
    parallel = torch.nn.parallel
    stock = parallel.DistributedDataParallel

    class _Door(stock):  # type: ignore[misc,valid-type]
        def __new__(cls, module: nn.Module, *args: Any, **kwargs: Any) -> Any:  # noqa: D102
            parallel.DistributedDataParallel = stock  # closed while dpcomm builds (and imports) its own
            try:
                return build(module, *args, **kwargs)  # not a _Door: Python skips __init__
            finally:
                parallel.DistributedDataParallel = cls

    parallel.DistributedDataParallel = _Door
    try:
        yield
    finally:
        parallel.DistributedDataParallel = stock


def _generators(obj: Any, depth: int = 0) -> Iterator[torch.Generator]:
    """The ``torch.Generator`` objects a data loader draws from: its own, its samplers' and batch samplers'
    (nested, as Accelerate's shards wrap them), its base loader's."""
    if obj is None or depth > 6:
        return
    for name in ("generator", "synchronized_generator"):
        g = getattr(obj, name, None)
        if isinstance(g, torch.Generator):
            yield g
    for name in ("sampler", "batch_sampler", "base_dataloader"):
        inner = getattr(obj, name, None)
        if inner is not None and inner is not obj:
            yield from _generators(inner, depth + 1)


@contextlib.contextmanager
def kept_random(*generators: torch.Generator) -> Iterator[None]:
    """Run the block, then put back every random state it may have drawn from: torch's (CPU and CUDA),
    Python's, NumPy's and ``generators``'."""
    saved = [g.get_state() for g in generators]
    py = random.getstate()
    try:
        import numpy as np

        npy: Any = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy ships with torch's wheels
        np, npy = None, None
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            for g, s in zip(generators, saved, strict=True):
                g.set_state(s)
            random.setstate(py)
            if np is not None:
                np.random.set_state(npy)


def first_batch(loader: Any) -> Any:
    """The first batch ``loader`` yields on this rank, every random state it draws from restored after
    (:func:`kept_random`, with its samplers' generators), so the epoch it then runs is the one it would have
    run. Accelerate's wrapped loaders are read through their base loader (their own iteration synchronises
    generators across ranks and registers with the gradient state)."""
    base = getattr(loader, "base_dataloader", loader)
    with kept_random(*{id(g): g for g in _generators(loader)}.values()):
        it = iter(base)
        try:
            return next(it)
        except StopIteration:
            raise UserError("dpcomm: the training data loader yields no batch to plan on") from None
        finally:
            del it  # its worker processes, if any, end here


def to_device(example: Any, module: nn.Module) -> Any:
    """``example`` as ``wrap``/``shard`` take it (a mapping, Hugging Face's ``BatchEncoding`` included, as a
    dict of keyword arguments), its tensors on ``module``'s device (its first parameter's)."""
    if isinstance(example, Mapping) and not isinstance(example, dict):
        example = dict(example)
    p = next(module.parameters(), None)
    if p is None:
        return example
    return map_tensors(example, lambda t: t.to(p.device))


def step_loss(output: Any) -> torch.Tensor:
    """The loss a training step returns: a tensor, or the ``loss`` of a Hugging Face model's output or a
    Lightning ``training_step``'s dict; else the sum of the floating outputs' means."""
    if isinstance(output, torch.Tensor) and output.dim() == 0:
        return output
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    from dpcomm.trace.profiler import default_loss

    return default_loss(output)
