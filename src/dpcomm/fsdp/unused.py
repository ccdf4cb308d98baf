"""Parameters some rank leaves without a gradient, under FSDP2 as DDP's ``find_unused_parameters`` has them.

A mixture's expert or a task's head may get a gradient on some ranks and not on others (the data decides).
FSDP2 reduce-scatters a unit's gradients only where the unit's parameters have one, so on such a unit the
ranks would run different collectives (gloo: "Received data size doesn't match expected size"). With
``set_reduce_scatter_unused_params(True)`` a rank adds zeros for the parameters it did not use, as DDP's
reducer does for locally unused parameters, and the sums agree.

DDP goes one step further (``Reducer::finalize_bucket_dense``, ``global_unused``): a parameter that *no*
rank used in the step keeps the ``.grad`` it had, ``None`` after ``zero_grad()``, where FSDP2 gives it a
zero tensor. The two differ in the optimizer's step: SGD's momentum and AdamW's decay move a parameter with
a zero gradient and skip one with ``None`` (issue 54, finding 3: 0.0062 apart after three steps of SGD with
momentum 0.9). :func:`reduce_zeros` closes that gap:

1. each unit holding such parameters reduce-scatters zeros for them (FSDP2's flag, ``recurse=False``);
2. every backward, each rank records which of those units' parameters got a gradient (a post-accumulate-grad
   hook on the unsharded parameter, hooked in the unit's forward, when FSDP2 has just gathered it);
3. once FSDP2's own end-of-backward callback has reduce-scattered (our callback queues itself behind it),
   the ranks all-reduce the record (one ``int32`` per parameter, ``MAX``), and a parameter no rank used
   whose ``.grad`` was ``None`` when the backward began gets ``None`` back.

Under ``set_requires_gradient_sync(False)`` (gradient accumulation) nothing is reduced and nothing is said:
the record accumulates until the backward that reduces, as DDP's ``no_sync`` defers its reduction.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpcomm.timing import group_device
from dpcomm.utils.user_run import tensors_in

__all__ = ["reduce_zeros"]


def _unit_of(mods: dict[str, nn.Module], name: str) -> str:
    """The path of the FSDP2 module whose unit holds parameter ``name`` (the nearest one above it)."""
    from torch.distributed.fsdp import FSDPModule

    path = name.rpartition(".")[0]
    while not isinstance(mods[path], FSDPModule):
        path = path.rpartition(".")[0]
    return path


def reduce_zeros(model: nn.Module, names: Collection[str], group: Any = None) -> None:
    """Steps 1-3 of the module docstring for the units holding parameters ``names`` (of the sharded
    ``model``); ``group``: the ranks whose use counts (every rank of the job, as DDP's)."""
    if not names:
        return
    mods = dict(model.named_modules())
    units = {_unit_of(mods, n) for n in names}
    for path in units:
        mods[path].set_reduce_scatter_unused_params(True, recurse=False)
    tracked = [n for n, p in model.named_parameters() if p.requires_grad and _unit_of(mods, n) in units]
    _Record(model, mods, tracked, [mods[u] for u in sorted(units)], group)


def _mark(used: torch.Tensor, k: int) -> Any:
    """The hook that records parameter ``k``'s gradient. It holds the record's tensor, not the record:
    autograd keeps hooks from C++, where the collector sees no cycle back to the model (the trial's copies
    would outlive ``shard``)."""

    def hook(_p: torch.Tensor) -> None:
        used[k] = 1

    return hook


class _Record:
    """The per-backward record of step 2 and the callback of step 3 (kept alive by the hooks it installs)."""

    def __init__(self, model: nn.Module, mods: dict[str, nn.Module], tracked: list[str],
                 units: list[nn.Module], group: Any) -> None:  # fmt: skip
        self.model, self.group, self.names, self.units = model, group, tracked, units
        self.index = {n: k for k, n in enumerate(tracked)}
        self.used = torch.zeros(len(tracked), dtype=torch.int32)
        self.was_none: list[bool] | None = None  # at the first backward since the last reduction
        self.queued = False
        self.hooked: dict[int, Any] = {}  # id(unsharded parameter) -> (parameter, handle)
        owners = {n: n.rpartition(".") for n in tracked}  # name -> (owner path, _, attribute)
        by_unit: dict[str, list[str]] = {}
        for n in tracked:
            by_unit.setdefault(_unit_of(mods, n), []).append(n)
        for path, ns in by_unit.items():
            hook = self._hook_unsharded(mods, [(n, *owners[n][::2]) for n in ns])
            mods[path].register_forward_pre_hook(hook)  # after FSDP2's (prepended): parameters gathered
        model.register_forward_hook(self._on_output)

    def _hook_unsharded(self, mods: dict[str, nn.Module], params: list[tuple[str, str, str]]) -> Any:
        def pre_forward(_module: nn.Module, _args: Any) -> None:
            for name, owner, attr in params:
                p = mods[owner]._parameters.get(attr)
                if p is None or id(p) in self.hooked or not p.requires_grad:
                    continue
                k, used = self.index[name], self.used  # the hook holds the record's tensor, not the record:
                # autograd keeps it from C++, where the collector cannot see a cycle back to the model
                handle = p.register_post_accumulate_grad_hook(
                    lambda _p, k=k, used=used: used.__setitem__(k, 1)
                )
                self.hooked[id(p)] = (p, handle)

        return pre_forward

    def _on_output(self, _module: nn.Module, _args: Any, output: Any) -> None:
        """At the root's forward exit: the first gradient into any output starts this backward's record."""
        if not torch.is_grad_enabled():
            return
        for t in tensors_in(output):
            if t.requires_grad:
                t.register_hook(self._on_backward_start)

    def _on_backward_start(self, grad: torch.Tensor) -> None:
        if self.queued:
            return
        self.queued = True
        if self.was_none is None:
            params = dict(self.model.named_parameters())
            self.was_none = [params[n].grad is None for n in self.names]
        from torch.autograd import Variable

        # behind FSDP2's end-of-backward callback, whatever order the two were queued in
        Variable._execution_engine.queue_callback(
            lambda: Variable._execution_engine.queue_callback(self._after_reduction)
        )

    def _after_reduction(self) -> None:
        self.queued = False
        if not self._synced():
            return  # accumulating: nothing was reduced; the record goes on
        used = self.used.to(group_device(self.group))  # NCCL: on the GPU
        dist.all_reduce(used, op=dist.ReduceOp.MAX, group=self.group)
        used = used.tolist()
        params = dict(self.model.named_parameters())
        for k, (name, none) in enumerate(zip(self.names, self.was_none or [], strict=True)):
            if none and not used[k]:
                params[name].grad = None  # no rank used it: as DDP leaves it
        self.used.zero_()  # in place: the hooks hold this tensor
        self.was_none = None

    def _synced(self) -> bool:
        """Whether FSDP2 reduced gradients in this backward (``set_requires_gradient_sync``)."""
        group = self.units[0]._get_fsdp_state()._fsdp_param_group  # type: ignore[operator]
        return True if group is None else bool(getattr(group, "reduce_grads", True))
