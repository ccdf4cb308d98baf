"""Flat gradient buffers, one per plan group (and dtype): the memory layout the runtime communicates.

A :class:`~dpcomm.plan.Plan` group is one message (MG-WFBP: the merged gradients of a run of layers).
Each group owns one contiguous 1-D buffer per *communication dtype*, holding its layers' gradients in
ascending layer order (so every layer is a contiguous slice, which the LP paper's layer-wise Alg. 1 uses to
broadcast parameters layer by layer through the same buffers). The buffers are allocated once and reused every
iteration: they are the only extra copy of the gradients the runtime makes.

The communication dtype is the gradient's own dtype by default (float16/bfloat16 gradients are summed in
their own precision, as DDP does), or ``reduce_dtype`` when given (e.g. float32: low-precision gradients are
upcast into the buffer, summed in float32 and rounded once when copied back).

Readiness (MG-WFBP Alg. 2 lines 25-28): :meth:`GradBuckets.mark_ready` counts a parameter's gradient into
its group; a group is complete when all its parameters were counted, and groups are released strictly in plan
order by :meth:`GradBuckets.pop_launchable`. The copy into the buffer (:meth:`GradBuckets.pack_grads`) is
left to the communication job, off the backward's critical path: a counted gradient is final for this
backward, so nothing writes it until the job has run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from dpcomm.plan import Plan

__all__ = ["GradBuckets", "Group", "Slot"]


@dataclass(slots=True, kw_only=True)
class Slot:
    """Where one parameter's gradient lives in its group's flat buffer."""

    param: nn.Parameter
    name: str
    """Parameter name in the wrapped module (``features.0.weight``)."""
    layer: int
    """Learnable layer index (forward order)."""
    group: int
    """Position of its group in the plan (communication order)."""
    dtype: torch.dtype
    """Dtype of the flat buffer it lives in."""
    offset: int
    """Element offset in that buffer."""


@dataclass(slots=True, kw_only=True)
class Group:
    """One plan group: its layers, its flat buffers and which of its parameters are ready this iteration."""

    index: int
    layers: tuple[int, ...]
    flats: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)
    slots: list[Slot] = field(default_factory=list)
    pending: int = 0
    """Parameters of the group whose gradient has not arrived this iteration."""

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.flats.values())


class GradBuckets:
    """The flat buffers of every plan group and the per-iteration readiness count."""

    def __init__(
        self,
        plan: Plan,
        params_per_layer: list[list[nn.Parameter]],
        names: dict[int, str],
        reduce_dtype: torch.dtype | None = None,
    ):
        if plan.num_layers != len(params_per_layer):
            raise ValueError(f"plan has {plan.num_layers} layers, the module {len(params_per_layer)}")
        self.plan = plan
        self.groups: list[Group] = []
        self.slot_of: dict[int, Slot] = {}
        self.layer_ranges: list[dict[torch.dtype, tuple[int, int, int]]] = [{} for _ in params_per_layer]
        """Per layer: dtype -> (group, start, end) element range of its parameters in that group's buffer."""
        for gi, layers in enumerate(plan.groups):
            group = Group(index=gi, layers=layers)
            sizes: dict[torch.dtype, int] = {}
            for layer in layers:
                for p in params_per_layer[layer]:
                    dt = reduce_dtype or p.dtype
                    start = sizes.get(dt, 0)
                    slot = Slot(
                        param=p, name=names.get(id(p), "?"), layer=layer, group=gi, dtype=dt, offset=start
                    )
                    group.slots.append(slot)
                    self.slot_of[id(p)] = slot
                    sizes[dt] = start + p.numel()
                    g0, s0, _ = self.layer_ranges[layer].get(dt, (gi, start, start))
                    self.layer_ranges[layer][dt] = (g0, s0, sizes[dt])
            device = params_per_layer[layers[0]][0].device if params_per_layer[layers[0]] else "cpu"
            group.flats = {dt: torch.zeros(n, dtype=dt, device=device) for dt, n in sizes.items()}
            self.groups.append(group)
        self._next = 0
        self._seen: set[int] = set()
        self._zeroed: set[int] = set()
        self.reset()

    @property
    def nbytes(self) -> int:
        """Bytes of all flat buffers (the runtime's one extra copy of the gradients)."""
        return sum(g.nbytes for g in self.groups)

    def reset(self) -> None:
        """Start a new iteration: nothing ready, nothing released."""
        for g in self.groups:
            g.pending = len(g.slots)
        self._next = 0
        self._seen.clear()
        self._zeroed.clear()

    def view(self, slot: Slot) -> torch.Tensor:
        flat = self.groups[slot.group].flats[slot.dtype]
        return flat.narrow(0, slot.offset, slot.param.numel()).view(slot.param.shape)

    def pack_grads(self, group: Group) -> None:
        """Copy the group's gradients into its buffers (those filled with zeros stay zero)."""
        for slot in group.slots:
            if id(slot.param) not in self._zeroed:
                self.view(slot).copy_(slot.param.grad)

    def mark_ready(self, param: nn.Parameter) -> Slot:
        """Count ``param``'s gradient (already accumulated in ``.grad``) into its group."""
        slot = self.slot_of[id(param)]
        if id(param) in self._seen:
            raise RuntimeError(
                f"DataParallel: parameter '{slot.name}' received its gradient twice in one iteration "
                "(two backward passes before step? run the earlier ones inside no_sync())"
            )
        self._seen.add(id(param))
        self.groups[slot.group].pending -= 1
        return slot

    def pop_launchable(self) -> list[Group]:
        """Complete groups not yet released, in plan order, stopping at the first incomplete one."""
        out = []
        while self._next < len(self.groups) and self.groups[self._next].pending == 0:
            out.append(self.groups[self._next])
            self._next += 1
        return out

    def missing(self) -> list[Slot]:
        """Parameters whose gradient has not arrived this iteration."""
        return [s for g in self.groups for s in g.slots if id(s.param) not in self._seen]

    def fill_missing_with_zeros(self) -> None:
        """Treat parameters without a gradient as zero gradients (``allow_unused=True``)."""
        for slot in self.missing():
            self.view(slot).zero_()
            self._zeroed.add(id(slot.param))
            self._seen.add(id(slot.param))
            self.groups[slot.group].pending -= 1

    def unpack_grads(self, group: Group, scale: float) -> None:
        """Write ``scale * buffer`` into each parameter's ``.grad`` (one pass; creating ``.grad`` where it is
        None). The product is computed in the buffer's dtype and rounded once into the gradient's."""
        for slot in group.slots:
            p, v = slot.param, self.view(slot)
            if p.grad is None:
                p.grad = (torch.mul(v, scale) if scale != 1.0 else v.clone()).to(p.dtype)
            elif scale != 1.0:
                torch.mul(v, scale, out=p.grad)
            else:
                p.grad.copy_(v)

    def pack_params(self, group: Group) -> None:
        for slot in group.slots:
            self.view(slot).copy_(slot.param.detach())

    def unpack_params(self, group: Group) -> None:
        for slot in group.slots:
            slot.param.detach().copy_(self.view(slot))

    def layer_slices(self, layer: int) -> list[tuple[Group, torch.Tensor]]:
        """The contiguous buffer slices holding ``layer``'s parameters (one per communication dtype)."""
        out = []
        for dt, (gi, start, end) in self.layer_ranges[layer].items():
            g = self.groups[gi]
            out.append((g, g.flats[dt].narrow(0, start, end - start)))
        return out

    def layer_slots(self, layer: int) -> list[Slot]:
        gi = next(iter(self.layer_ranges[layer].values()), (None,))[0]
        if gi is None:
            return []
        return [s for s in self.groups[gi].slots if s.layer == layer]
