"""DeAR's schedule in the runtime: reduce-scatter in backward, step on shards, all-gather in the next forward.

A ``dear`` plan (:mod:`dpcomm.planner.dear`) keeps the plan's flat buffers (:mod:`dpcomm.runtime.buckets`)
and cuts each into ``P`` chunks, ``chunk_bounds(n, P)``: rank ``r`` owns chunk ``r`` of every group.

1. Backward: a complete group is packed and **reduce-scattered** on the communication thread (the
   collective's ``reduce_scatter``: dpcomm's ring on gloo, NCCL's on GPUs); rank ``r``'s chunk then holds
   the sum, and its average is written into the owned slices of the parameters' ``.grad``.
2. The step (:meth:`Shards.step`): the user's optimizer class, built once over *shard views* (1-D views of
   each parameter's storage over the elements this rank owns) with the user's param groups, steps only the
   owned elements; its state (momentum, Adam's moments) exists only for them (ZeRO-1). The user's param
   groups' hyperparameters are copied in before every step, so LR schedulers and edits take effect as they
   do on the user's optimizer. A ``GradScaler``'s inf check is made global (MAX over ranks) before it decides,
   so a skipped step is skipped on every rank. :meth:`Shards.clip_grad_norm_` takes the global norm from the
   shards (one all-reduce of a scalar).
3. At the start of the next forward (or a ``flush``) the owned elements are copied into each group's buffer
   and **all-gathered** on the communication thread, groups in forward order; each learnable layer's forward
   pre-hook waits for its group's gather (:class:`Gathers`), and :meth:`Gathers.finish` waits for whatever
   the forward did not call. Starting at the forward rather than at the step keeps nothing in flight
   between iterations (user code between step and forward, other wrappers in the process), at the cost of
   any gap between them; ``flush`` (before evaluation, ``state_dict``, a plan change) makes the parameters
   current at once.

Elementwise optimizers (SGD, momentum, Adam, AdamW, ...) give the same update on a slice as on the whole
tensor, so the parameters equal an all-reduce plan's up to the order of the sums. Optimizer state is handed
to and from the user's optimizer in full shape (:meth:`Shards.consolidate`, :meth:`Shards._load_state`), so
checkpoints and a switch of plan keep it. Cost per iteration and rank: ``(P-1)/P`` of the gradient bytes sent
in each phase (half an all-reduce each), one scalar all-reduce per clip, one per scaler step.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dpcomm.errors import UserError
from dpcomm.runtime.buckets import GradBuckets, Group, Slot
from dpcomm.runtime.comm_thread import CommJob, CommThread
from dpcomm.schedules import chunk_bounds

__all__ = ["Gathers", "Piece", "Shards", "reduce_scatter_job"]


@dataclass(slots=True, frozen=True)
class Piece:
    """The part of one parameter this rank owns: elements ``lo..hi`` of its flat view, at ``flat_lo`` in its
    group's buffer."""

    slot: Slot
    lo: int
    hi: int
    flat_lo: int


def _label(op: str, g: Group) -> str:
    return f"{op} group {g.index} (layers {g.layers[0]}-{g.layers[-1]}, {g.nbytes} B)"


def _pieces(b: GradBuckets, rank: int, world: int) -> list[list[Piece]]:
    """Per group, the pieces of its parameters inside this rank's chunk of each buffer."""
    out = []
    for g in b.groups:
        own = {dt: chunk_bounds(flat.numel(), world)[rank] for dt, flat in g.flats.items()}
        pieces = []
        for s in g.slots:
            a, z = own[s.dtype]
            lo, hi = max(a, s.offset), min(z, s.offset + s.param.numel())
            if lo < hi:
                pieces.append(Piece(slot=s, lo=lo - s.offset, hi=hi - s.offset, flat_lo=lo))
        out.append(pieces)
    return out


def reduce_scatter_job(
    coll: Any, b: GradBuckets, g: Group, pieces: list[Piece], group: Any, world: int
) -> tuple[str, Callable[[], None]]:
    """Pack the group's gradients, reduce-scatter them, write the owned chunk's average into ``.grad``."""

    def run() -> None:
        b.pack_grads(g)
        if world > 1:
            for flat in g.flats.values():
                coll.reduce_scatter(flat, group=group)
        for pc in pieces:
            p, flat = pc.slot.param, g.flats[pc.slot.dtype]
            src = flat[pc.flat_lo : pc.flat_lo + pc.hi - pc.lo]
            if p.grad is None:  # allow_unused: a parameter without a gradient gets one
                p.grad = torch.zeros_like(p)
            torch.mul(src, 1.0 / world, out=p.grad.view(-1)[pc.lo : pc.hi])

    return _label("reduce-scatter", g), run


class Gathers:
    """The all-gathers of one step's new parameters, a job per group in forward order, and the waits of the
    next forward's layers for them (made by :meth:`Shards.start_gathers`)."""

    def __init__(self, jobs: dict[int, CommJob], group_of_layer: list[int]):
        self._jobs, self._group_of_layer = jobs, group_of_layer
        self.waited_s = 0.0
        """Seconds the forward waited for its parameters (exposed communication)."""

    def before_layer(self, layer: int, wait: Callable[[CommJob], float]) -> None:
        job = self._jobs.pop(self._group_of_layer[layer], None)
        if job is not None:
            self.waited_s += wait(job)

    def finish(self, wait: Callable[[CommJob], float]) -> None:
        """Wait for every gather not waited for yet (layers the forward did not call; a flush)."""
        jobs, self._jobs = self._jobs, {}
        for job in jobs.values():
            self.waited_s += wait(job)


class Shards:
    """This rank's shard of a ``dear`` plan's buffers: the pieces, the optimizer over them, the gathers."""

    def __init__(self, b: GradBuckets, coll: Any, group: Any, rank: int, world: int):
        for g in b.groups:
            for s in g.slots:
                if not s.param.is_contiguous():
                    raise UserError(f"dear: parameter '{s.name}' is not contiguous (shards view its storage)")
        self.b, self._coll, self._pg, self.rank, self.world = b, coll, group, rank, world
        self.pieces = _pieces(b, rank, world)
        self._views = [[pc.slot.param.detach().view(-1)[pc.lo : pc.hi] for pc in ps] for ps in self.pieces]
        self._opt: torch.optim.Optimizer | None = None
        self._user: Any = None
        self._held: list[tuple[torch.Tensor, Piece]] = []
        """(shard view, piece) for every view the shard optimizer steps, in its order (set when built)."""
        self._unscaled = False
        self.group_of_layer = [0] * len(b.layer_ranges)
        for g in b.groups:
            for layer in g.layers:
                self.group_of_layer[layer] = g.index

    def job(self, g: Group) -> tuple[str, Callable[[], None]]:
        return reduce_scatter_job(self._coll, self.b, g, self.pieces[g.index], self._pg, self.world)

    # ------------------------------------------------------------------ the optimizer over the shards

    def optimizer(self, user: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The user's optimizer class over this rank's shard views (built on first use, then kept)."""
        if self._opt is not None and self._user is user:
            return self._opt
        if self._opt is not None:
            raise UserError("dear: step() was given a different optimizer than before")
        where = {id(p): i for i, pg in enumerate(user.param_groups) for p in pg["params"]}
        groups: dict[int, list[tuple[torch.Tensor, Piece]]] = {}
        for vs, ps in zip(self._views, self.pieces, strict=True):
            for v, pc in zip(vs, ps, strict=True):
                ug = where.get(id(pc.slot.param))
                if ug is not None:  # a parameter the user's optimizer does not hold is not stepped
                    groups.setdefault(ug, []).append((v, pc))
        self._user_groups = sorted(groups)
        self._held = [held for i in self._user_groups for held in groups[i]]
        spec = [
            {**_hyper(user.param_groups[i]), "params": [v for v, _ in groups[i]]} for i in self._user_groups
        ]
        if not spec:  # this rank owns nothing: an empty tensor keeps every call the same on every rank
            self._user_groups = [0]
            spec = [{**_hyper(user.param_groups[0]), "params": [torch.zeros(0, device=self._device())]}]
        try:
            accepted = inspect.signature(type(user)).parameters  # defaults may hold more (AdamW's)
            self._opt = type(user)(spec, **{k: v for k, v in user.defaults.items() if k in accepted})
        except Exception as exc:
            raise UserError(
                f"dear: cannot rebuild {type(user).__name__} over the shards ({exc}); use an elementwise "
                "torch.optim optimizer (SGD, Adam, AdamW, ...)"
            ) from exc
        self._user = user
        self._opt._optimizer_step_pre_hooks = user._optimizer_step_pre_hooks  # the user's step hooks
        self._opt._optimizer_step_post_hooks = user._optimizer_step_post_hooks  # run around the shard step
        self._load_state(user)
        return self._opt

    def _device(self) -> torch.device:
        return next((pc.slot.param.device for ps in self.pieces for pc in ps), torch.device("cpu"))

    def _load_state(self, user: torch.optim.Optimizer) -> None:
        """Slices of the user's optimizer state (a checkpoint loaded into it, an all-reduce plan's steps)."""
        for v, pc in self._held:
            full = user.state.get(pc.slot.param)
            if not full:
                continue
            p = pc.slot.param
            self._opt.state[v] = {
                k: (t.detach().reshape(-1)[pc.lo : pc.hi].clone()
                    if torch.is_tensor(t) and t.shape == p.shape else _copy(t))
                for k, t in full.items()
            }  # fmt: skip
        user.state.clear()  # the shards hold it now: no stale full copy

    def consolidate(self) -> None:
        """Write the shards' optimizer state into the user's optimizer in full shape (every rank calls it).

        A state tensor shaped like its parameter (momentum, Adam's moments) is gathered by a sum over ranks
        of zeros and each rank's piece (every element has one owner, so the sum is exact); any other entry
        (Adam's step) is the same on every rank owning a piece and is taken from the first of them."""
        if self._opt is None:
            return
        user = self._user
        held = {id(p) for pg in user.param_groups for p in pg["params"]}
        params = [s.param for g in self.b.groups for s in g.slots if id(s.param) in held]
        index = {id(p): i for i, p in enumerate(params)}
        mine = {id(pc.slot.param): (v, pc) for v, pc in self._held}
        local: dict[int, dict[str, Any]] = {}
        for pid, (v, _pc) in mine.items():
            for k, t in self._opt.state.get(v, {}).items():
                shaped = torch.is_tensor(t) and t.dim() == 1 and t.numel() == v.numel()
                local.setdefault(index[pid], {})[k] = ("shaped", t.dtype) if shaped else ("value", _cpu(t))
        every: list[Any] = [None] * self.world
        dist.all_gather_object(every, local, group=self._pg)
        for i, p in enumerate(params):
            entries: dict[str, Any] = {}
            for r in range(self.world):
                for k, e in every[r].get(i, {}).items():
                    entries.setdefault(k, e)
            state = {}
            for k, (kind, x) in sorted(entries.items()):
                if kind == "value":
                    state[k] = x.to(p.device) if torch.is_tensor(x) and x.dim() else x
                    continue
                full = torch.zeros(p.numel(), dtype=x, device=p.device)
                v_pc = mine.get(id(p))
                if v_pc is not None and k in self._opt.state.get(v_pc[0], {}):
                    full[v_pc[1].lo : v_pc[1].hi] = self._opt.state[v_pc[0]][k]
                dist.all_reduce(full, op=dist.ReduceOp.SUM, group=self._pg)  # exact: x + 0 = x
                state[k] = full.view(p.shape)
            if state:
                user.state[p] = state

    # ------------------------------------------------------------------ step, clip, scaler

    def _prepare(self, user: torch.optim.Optimizer) -> torch.optim.Optimizer:
        opt = self.optimizer(user)
        for sg, ui in zip(opt.param_groups, self._user_groups, strict=True):
            sg.update(_hyper(user.param_groups[ui]))
        for v, pc in self._held:
            g = pc.slot.param.grad
            v.grad = None if g is None else g.view(-1)[pc.lo : pc.hi]
        return opt

    def unscale_(self, user: torch.optim.Optimizer, scaler: Any) -> None:
        """``scaler.unscale_`` on the shards, then the inf check made global (every rank skips together)."""
        if self._unscaled:
            return
        opt = self._prepare(user)
        scaler.unscale_(opt)
        for found in scaler._per_optimizer_states[id(opt)]["found_inf_per_device"].values():
            dist.all_reduce(found, op=dist.ReduceOp.MAX, group=self._pg)
        self._unscaled = True

    def clip_grad_norm_(self, max_norm: float, norm_type: float) -> torch.Tensor:
        """Scale the owned gradients so the global ``norm_type`` norm is at most ``max_norm``, as
        ``torch.nn.utils.clip_grad_norm_`` does on the averaged gradients; returns the global norm."""
        grads = [pc.slot.param.grad.view(-1)[pc.lo : pc.hi] for ps in self.pieces for pc in ps
                 if pc.slot.param.grad is not None]  # fmt: skip
        dev = self._device()
        norm_type = float(norm_type)
        if norm_type == float("inf"):
            local = max(
                (g.abs().max().double() for g in grads if g.numel()),
                default=torch.zeros((), dtype=torch.float64),
            )
            total = local.reshape(1).to(dev)
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=self._pg)
        else:
            local = sum(
                (g.double().abs().pow(norm_type).sum() for g in grads), torch.zeros((), dtype=torch.float64)
            )
            total = local.reshape(1).to(dev)
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self._pg)
            total = total.pow(1.0 / norm_type)
        norm = total[0].float()
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
        return norm

    def step(self, user: torch.optim.Optimizer, scaler: Any = None) -> None:
        """The user's optimizer step on this rank's shards (every rank calls it)."""
        opt = self._prepare(user)
        if scaler is None:
            opt.step()
        else:
            self.unscale_(user, scaler)
            scaler.step(opt)
        self._unscaled = False
        user._opt_called = True  # what torch's LR schedulers read to see that the optimizer stepped

    def start_gathers(self, comm: CommThread) -> Gathers:
        """Queue every group's all-gather of the new parameters, forward order (the forward waits)."""
        jobs = {}
        for g in sorted(self.b.groups, key=lambda g: g.layers[0]):
            jobs[g.index] = comm.submit(*self._gather_job(g), g.nbytes)
        return Gathers(jobs, self.group_of_layer)

    def _gather_job(self, g: Group) -> tuple[str, Callable[[], None]]:
        b, pieces, coll, pg, world = self.b, self.pieces[g.index], self._coll, self._pg, self.world

        def run() -> None:
            if world == 1:
                return
            for pc in pieces:
                flat = g.flats[pc.slot.dtype]
                flat[pc.flat_lo : pc.flat_lo + pc.hi - pc.lo] = pc.slot.param.detach().view(-1)[pc.lo : pc.hi]
            for flat in g.flats.values():
                coll.allgather(flat, group=pg)
            b.unpack_params(g)

        return _label("all-gather", g), run


def _hyper(group: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}


def _copy(x: Any) -> Any:
    return x.detach().clone() if torch.is_tensor(x) else x


def _cpu(x: Any) -> Any:
    return x.detach().cpu().clone() if torch.is_tensor(x) else x
