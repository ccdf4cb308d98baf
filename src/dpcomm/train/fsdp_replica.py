"""The replica kinds ``fsdp`` and ``hsdp``: ``--schedule fsdp:PLANNER[,memory=BYTES][,mesh=G]`` trains with
stock PyTorch FSDP2 (``fully_shard``) whose units, prefetch depth and reshard choice are a dpcomm FSDP plan
(:func:`dpcomm.fsdp.shard`; planners ``per-block``, ``whole``, ``per-layer``, ``size:BYTES``, ``optimal``,
``docs/fsdp.md``). ``memory``: the budget of unsharded parameter bytes (``64MB`` = 64 MiB; also
``--memory``). ``hsdp:PLANNER[:G][,memory=BYTES]`` (or ``mesh=G``) is HSDP: FSDP2 on a 2-D mesh, each unit
sharded over groups of ``G`` ranks and replicated across them (``shard``'s ``mesh=``); without ``G`` (or
``:auto``) the planner chooses it among the divisors of the ranks. ``--param-dtype``/``--reduce-dtype``:
FSDP2's ``MixedPrecisionPolicy``, applied to every unit (:mod:`dpcomm.planner.fsdp_precision`).

The first iteration's batch is the example ``shard`` profiles on; planning, the trial of ``optimal`` against
``per-block`` and that iteration are one ``profile`` record, the rest are steady. FSDP2's all-gathers and
reduce-scatters run inside forward and backward (gloo on CPU: ``all_gather_single`` and
``reduce_scatter_single`` with ``ReduceOp.AVG``), so the records put them there: ``exposed_comm_s`` is 0
and ``comm_s`` None.

Checkpoints hold the *full* state, as every other kind's do (plain tensors under the model's own names;
the optimizer's state by parameter index), so any kind can resume them: the loop writes
``model.state_dict()`` and ``optimizer.state_dict()`` on rank 0 only, which for FSDP2 hold sharded
DTensors, so after each iteration that ends with a save (the loop's rule, known in advance: this kind is
settled from its first iteration on) every rank gathers the full tensors (``DTensor.full_tensor``) and
the two ``state_dict`` post-hooks hand rank 0's copy to the loop. On resume the full state is loaded
into the unsharded model (:func:`dpcomm.train.setup.build_model`), the checkpoint's plan is sharded as it
was (no planning: the layers' parameter names are in the checkpoint), and each optimizer state tensor is
cut to its parameter's shard, so the resumed run is bitwise the uninterrupted one.

:meth:`FsdpReplica.finish` gathers the parameters into a plain copy of the model (``model`` from then on):
its hash is the gathered parameters', equal on every rank, and rank 0 can test it alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dpcomm.errors import UserError
from dpcomm.planner.fsdp import FSDP_METHODS
from dpcomm.planner.fsdp_model import FsdpPlan
from dpcomm.planner.fsdp_precision import Precision
from dpcomm.runtime.records import Phase
from dpcomm.train.config import TrainConfig, total_iterations
from dpcomm.train.ddp_replica import DDPTimedReplica
from dpcomm.train.replica import ReplicaContext, ReplicaKind, register_kind
from dpcomm.train.setup import UpdateTimer
from dpcomm.utils.sizes import parse_size

__all__ = ["FsdpReplica", "FsdpSchedule", "check", "check_budget", "parse_schedule", "precision_of"]

KIND = "fsdp"
HSDP = "hsdp"
_FORMS = "fsdp:PLANNER[,memory=BYTES][,mesh=G] or hsdp:PLANNER[:G][,memory=BYTES]"


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpSchedule:
    """``fsdp:PLANNER[,memory=BYTES][,mesh=G]`` or ``hsdp:PLANNER[:G]`` parsed."""

    method: str
    """The FSDP planner (``optimal``, ``per-block``, ``size:4MB``, ...)."""
    memory: int | None = None
    """Budget of unsharded parameter bytes (None: none)."""
    mesh: int | str | None = None
    """HSDP: the shard group size ``G``, or ``"auto"`` (the planner chooses); None: FSDP over every rank."""


def _mesh(value: str, text: str) -> int | str:
    v = value.strip().lower()
    if v == "auto":
        return v
    if not (v.isdigit() and len(v) < 10 and int(v) >= 1):
        raise UserError(f"schedule {text!r}: the shard group must be an integer >= 1 or auto, got {value!r}")
    return int(v)


def parse_schedule(text: str, memory: str | int | None = None) -> FsdpSchedule:
    """``fsdp:PLANNER[,memory=BYTES][,mesh=G]`` or ``hsdp:PLANNER[:G][,memory=BYTES]``; ``memory``
    (``--memory``) applies unless the schedule sets it."""
    name, sep, rest = text.strip().partition(":")
    if name not in (KIND, HSDP) or not sep or not rest.strip():
        raise UserError(f"schedule {text!r}: write {_FORMS}, PLANNER one of {', '.join(FSDP_METHODS)}")
    method, *opts = [p.strip() for p in rest.split(",")]
    method = method.lower()
    mesh: int | str | None = None
    if name == HSDP:
        head, _, tail = method.rpartition(":")
        if head and head != "size" and (tail.isdigit() or tail == "auto"):  # size:64 is a size in bytes
            method, mesh = head, _mesh(tail, text)
        else:
            mesh = "auto"
    if method.startswith("size:"):
        parse_size(method[5:], what="FSDP unit size", minimum=1)
    elif method not in FSDP_METHODS:
        raise UserError(f"unknown FSDP planner {method!r} in {text!r}: use one of {', '.join(FSDP_METHODS)}")
    budget, what = memory, "--memory"
    for opt in opts:
        key, eq, value = opt.partition("=")
        if key.strip() == "mesh" and eq:
            if name == HSDP and method != rest.split(",")[0].strip().lower():
                raise UserError(f"schedule {text!r} gives the shard group twice: give one")
            mesh = _mesh(value, text)
            continue
        if key.strip() != "memory" or not eq:
            raise UserError(f"schedule {text!r}: unknown option {opt!r} (memory=BYTES, mesh=G)")
        if memory is not None:
            raise UserError(f"schedule {text!r} sets memory=, and --memory is given too: give one")
        budget, what = value.strip(), f"schedule {text!r}: memory"
    if isinstance(budget, str):
        budget = parse_size(budget, what=what, minimum=0)
    return FsdpSchedule(method=method, memory=budget, mesh=mesh)


def check(cfg: TrainConfig, schedule: str) -> FsdpSchedule:
    """The schedule parsed; FSDP2 runs its own collectives, in overlap mode, planned once."""
    parsed = parse_schedule(schedule, getattr(cfg, "memory", None))
    if cfg.mode != "overlap":
        raise UserError(
            f"--schedule {schedule} runs PyTorch's FSDP2; --mode {cfg.mode} needs a dpcomm schedule"
        )
    if cfg.collective != "native":
        raise UserError(
            f"--schedule {schedule} runs FSDP2's own collectives; drop --collective {cfg.collective}"
        )
    if cfg.replan_every:
        raise UserError(f"--replan-every is not supported by --schedule {schedule} (FSDP2 is sharded once)")
    P = cfg.world_size
    if isinstance(parsed.mesh, int) and P % parsed.mesh:
        raise UserError(f"--schedule {schedule}: a shard group of {parsed.mesh} ranks does not divide "
                        f"the {P} ranks")  # fmt: skip
    check_budget(cfg, parsed, schedule)
    return parsed


def check_budget(cfg: TrainConfig, parsed: FsdpSchedule, schedule: str) -> None:
    """A budget no plan can meet, said in the parent before any worker starts (not by rank 0's planner
    after every worker has started and profiled). From the parameters' sizes alone (the zoo model built on
    the ``meta`` device, in the run's dtype): every unit holds whole parameters and is unsharded in full
    for its forward (the model's peak, ``docs/fsdp.md``), so no plan fits less than the largest
    parameter's bytes, and ``whole`` (one unit) needs them all. A budget above this bound that still fits
    no plan is the planner's to refuse, on the workers."""
    if parsed.memory is None:
        return
    import torch

    from dpcomm.models import get_model
    from dpcomm.train.config import torch_dtype

    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = get_model(cfg.model, 10 if cfg.data == "digits" else None)
    size = torch_dtype(cfg).itemsize  # bytes per element of the trained parameters
    nbytes = {n: p.numel() * size for n, p in model.named_parameters() if p.requires_grad}
    budget = f"a budget of {parsed.memory:,} bytes"
    if parsed.method == "whole" and sum(nbytes.values()) > parsed.memory:
        raise UserError(f"--schedule {schedule}: no plan fits {budget}; whole (one unit) holds all "
                        f"{sum(nbytes.values()):,} bytes of {cfg.model}'s parameters unsharded")  # fmt: skip
    name = max(nbytes, key=nbytes.__getitem__, default=None)
    if name is not None and nbytes[name] > parsed.memory:
        raise UserError(f"--schedule {schedule}: no plan fits {budget}; {cfg.model}'s largest parameter, "
                        f"{name}, alone holds {nbytes[name]:,} bytes unsharded")  # fmt: skip


class FsdpReplica(DDPTimedReplica):
    """FSDP2 with a dpcomm plan on this rank (see :mod:`dpcomm.train.replica`)."""

    def __init__(self, ctx: ReplicaContext):
        super().__init__(ctx)  # the unsharded model and optimizer, the checkpoint's full state loaded
        self._parsed: FsdpSchedule = ctx.parsed
        self._total = total_iterations(ctx.cfg)
        self._snapshot: tuple[dict[str, Any], dict[str, Any]] | None = None
        self._sharded: Any = None
        self.ready_s = float("inf")  # no separate communication phase: see the module docstring
        state = ctx.state or {}
        layers = (state.get("replica") or {}).get("layer_params")
        if state.get("plan") is not None and layers is not None:
            self._shard(FsdpPlan.from_dict(state["plan"]), None, layers)

    def _shard(self, plan: FsdpPlan | str, x: Any, layers: Any = None) -> None:
        import time

        from dpcomm.fsdp import shard, shard_compiled

        cfg, t0 = self.cfg, time.perf_counter()
        resumed = self.optimizer.state_dict()  # the checkpoint's full optimizer state (or empty)
        mesh = self._parsed.mesh
        if isinstance(plan, FsdpPlan):  # a checkpoint's plan runs on its own mesh
            mesh = None if plan.shard_group is None else plan.shard_group
        kw = dict(example=x, memory=self._parsed.memory, profile_iters=cfg.profile_iters,
                  verify_iters=cfg.verify_iters, layer_params=layers, mesh=mesh)  # fmt: skip
        policy = precision_of(cfg).torch_policy()
        if policy is not None:
            kw["mp_policy"] = policy
        if cfg.compile is None:
            self.model = shard(self.model, plan, **kw)
        else:  # each unit compiled after sharding (hooks and prefetch stay), the plan priced on their times
            self.model = shard_compiled(self.model, plan, backend=cfg.compile, **kw)
        self._sharded = self.wrapper = self.model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        self._update = UpdateTimer(self.optimizer)
        if resumed["state"]:
            self.optimizer.load_state_dict(resumed)
            _shard_state(self.optimizer)
        self.model.register_state_dict_post_hook(lambda *a: self._full_model(*a))  # torch tags the hook:
        self.optimizer.register_state_dict_post_hook(self._full_optimizer)  # a bound method cannot be
        self._log(plan if isinstance(plan, str) else "checkpoint", time.perf_counter() - t0)

    def _log(self, source: str, took: float) -> None:
        d = self.model.dpcomm
        p = d.plan
        units = ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in p.units)
        trial = "; timed " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in d.trial.items()) if d.trial else ""
        self.log.append(
            f"[rank {self.rank}] FSDP2 with plan '{p.method}' ({len(p.units)} units: layers {units}; "
            f"prefetch {p.depth}, reshard {'yes' if p.reshard_after_forward else 'no'}) from {source}, "
            f"decided in {took:.1f} s{trial}"
        )
        if d.ag_cost is not None and d.ag_cost.b:
            self.log.append(
                f"[rank {self.rank}] all-gather {d.ag_cost}, reduce-scatter {d.rs_cost} (B = full bytes)"
            )
        self.log.extend(f"[rank {self.rank}] {n}" for n in d.groups.notes)
        if not (precision := precision_of(self.cfg)).plain:
            self.log.append(f"[rank {self.rank}] FSDP2's MixedPrecisionPolicy on every unit: {precision}")

    def iteration(self, x: Any, y: Any) -> float:
        first = self._sharded is None
        if first:  # planning runs forward passes (dropout draws): this iteration's stay the loop's
            rng = torch.get_rng_state()
            self._shard(self._parsed.method, x)
            torch.set_rng_state(rng)
        self._snapshot = None
        loss = self._step(
            x, y, Phase.PROFILE if first else Phase.STEADY, f"fsdp:{self.model.dpcomm.plan.method}"
        )
        done = self.start + len(self.records)  # iterations completed, counted from 0
        cfg = self.cfg
        if cfg.checkpoint and (
            done == self._total or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0)
        ):
            self._gather()  # the loop saves now (rank 0): every rank takes part in the gathers
        return loss

    def _gather(self) -> None:
        model = {k: _full(v) for k, v in self.model.state_dict().items()}
        optim = self.optimizer.state_dict()
        optim["state"] = {i: {k: _full(v) for k, v in s.items()} for i, s in optim["state"].items()}
        self._snapshot = (model, optim) if self.rank == 0 else None

    def _full_model(self, _module: Any, state: dict[str, Any], prefix: str, _meta: Any) -> None:
        if self._snapshot is not None:
            state.update({prefix + k: v for k, v in self._snapshot[0].items()})

    def _full_optimizer(self, _optimizer: Any, _state: dict[str, Any]) -> dict[str, Any] | None:
        return self._snapshot[1] if self._snapshot is not None else None

    @property
    def plan(self) -> FsdpPlan | None:  # the loop only calls to_dict() on it
        return self._sharded.dpcomm.plan if self._sharded is not None else None

    @property
    def settled(self) -> bool:
        return self._sharded is not None

    def checkpoint_state(self) -> dict[str, Any]:
        if self._sharded is None:
            return {}
        return {"layer_params": [list(x) for x in self._sharded.dpcomm.layer_params]}

    def finish(self) -> None:
        """Gather the parameters (every rank) into a plain copy of the model, which ``model`` becomes."""
        if self._sharded is None or self.model is not self._sharded:
            return
        from dpcomm.models import get_model

        self._snapshot = None  # the last checkpoint's copy (rank 0): the gather below must run everywhere
        full = {k: _full(v) for k, v in self._sharded.state_dict().items()}
        with torch.random.fork_rng(devices=[]):
            plain = get_model(self.cfg.model, 10 if self.cfg.data == "digits" else None)
        plain.load_state_dict(full)
        self.model = plain

    def result_fields(self) -> dict[str, Any]:
        d = self._sharded.dpcomm if self._sharded is not None else None
        # "cost" holds the fitted all-gather and reduce-scatter (a, b) of full bytes, no "a": the
        # simulator's prediction of train.report.predict is for all-reduce plans
        cost = None
        if d is not None and d.ag_cost is not None and d.rs_cost is not None:
            cost = {"all_gather": [d.ag_cost.a, d.ag_cost.b], "reduce_scatter": [d.rs_cost.a, d.rs_cost.b]}
        trace = d.trace.to_dict() if d is not None and d.trace else None
        return {"collective": "native", "trace": trace, "cost": cost}

    def close(self) -> None:
        pass


def _full(value: Any) -> Any:
    """A DTensor gathered to a plain tensor on every rank (a collective); anything else as it is."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


def _shard_state(optimizer: torch.optim.Optimizer) -> None:
    """Cut each full optimizer state tensor to its parameter's shard (every rank holds the same full
    tensor, so no communication: ``src_data_rank=None``)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for p, st in optimizer.state.items():
        for k, v in st.items():
            if (
                isinstance(p, DTensor)
                and torch.is_tensor(v)
                and not isinstance(v, DTensor)
                and v.shape == p.shape
            ):
                st[k] = distribute_tensor(v, p.device_mesh, p.placements, src_data_rank=None)


def precision_of(cfg: TrainConfig) -> Precision:
    """``--param-dtype``/``--reduce-dtype`` as FSDP2's mixed-precision policy (plain without them)."""
    return Precision(param_dtype=cfg.param_dtype, reduce_dtype=cfg.reduce_dtype)


register_kind(
    ReplicaKind(name=KIND, build=FsdpReplica, check=check, summary="PyTorch FSDP2 with a dpcomm FSDP plan")
)
register_kind(
    ReplicaKind(
        name=HSDP,
        build=FsdpReplica,
        check=check,
        summary="PyTorch FSDP2 on a 2-D mesh (HSDP) with a dpcomm plan",
    )  # fmt: skip
)
