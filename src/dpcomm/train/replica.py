"""The replica protocol: what the training loop needs from one kind of data-parallel replica, and the registry
that maps a schedule to its kind.

A *replica* is one schedule's model, optimizer and gradient communication on one rank. The loop
(:mod:`dpcomm.train.loop`) builds one replica per schedule on every rank, runs ``iteration(x, y)`` on the same
batch for each (interleaved, so schedules compared in one run see the same machine load), saves checkpoints
from the first replica on rank 0, and at the end asks each replica for its measurements. The loop never looks
inside a replica: adding a kind (dpcomm's runtime, PyTorch DDP, a parameter server, DDP with a dpcomm plan)
is one :func:`register_kind` call in a module imported by :func:`_builtin`, not an edit of the loop.

A kind is chosen by the schedule's *name*, the text before the first ``:`` (``ddp``, ``ps:ibatch`` -> ``ps``);
a name no kind registered goes to the default kind, dpcomm's runtime, whose names are the planners'
(``wfbp``, ``single``, ``bucket:25MB``, ``mgwfbp``, ``optimal``).

What a replica must do (the loop relies on every point):

1. **Build** from a :class:`ReplicaContext`: the run's :class:`~dpcomm.train.config.TrainConfig`, the schedule
   (text and what the kind's ``check`` parsed from it, once, in the parent process), rank, world size, and
   the checkpoint being resumed (or None). Seed the model with ``torch.manual_seed(cfg.seed)`` before
   building it (:func:`dpcomm.train.setup.build_model` does this, the SGD optimizer and the update timer)
   and load ``state["model"]``/``state["optimizer"]`` when resuming; set ``start`` to ``state["iteration"]``.
2. **iteration(x, y)**: one synchronous SGD iteration on this rank's batch (zero grads, forward,
   cross-entropy, backward, communicate, optimizer step); append one record to ``records`` and return the
   loss as a float (also kept in ``loss``). The loop reseeds torch before each call (dropout masks).
3. **records**: one dict per iteration with the keys of :class:`dpcomm.runtime.records.IterRecord`
   (``iteration, forward_s, backward_s, exposed_comm_s, step_s, total_s, comm_s`` in seconds, ``comm_s``
   may be None; ``phase``: a :class:`~dpcomm.runtime.records.Phase`; ``plan``: the label of the plan run)
   plus ``update_s`` (the ``optimizer.step()`` time, 0 where this rank did not step). Only ``Phase.STEADY``
   iterations after the first count in the reported medians.
4. **log**: this rank's one-line messages (``[rank R] ...``) for the user; rank 0's are printed.
5. **plan**: the :class:`~dpcomm.plan.Plan` to save in the checkpoint (None: none, or not decided yet), and
   **checkpoint_state()**: any further state to save (a dict of tensors, numbers, strings, lists, dicts;
   ``{}`` for none), handed back on resume as ``state["replica"]``. An optional **before_checkpoint()** runs
   on every rank before rank 0 saves (a sharded optimizer gathers its state into ``optimizer`` there).
6. **spans()**: this rank's timeline of its last iterations (a list per iteration of
   :class:`~dpcomm.runtime.records.Span`, rows ``compute`` and ``comm``) for ``--chrome-trace``.
7. **finish()**: make every rank's parameters current (e.g. a last broadcast) -- called on every rank
   after the last iteration, before **params_sha256()** (a hash of this rank's parameters, equal on every
   rank when replicas agree bitwise) and **result_fields()**: the :class:`~dpcomm.train.config.TrainResult`
   fields this kind knows: ``collective`` (what moved the gradients) always; ``trace``, ``cost``,
   ``grad_buffer_bytes`` where it has them. **close()** then releases hooks, threads and sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import nn
    from torch.optim import Optimizer

    from dpcomm.plan import Plan
    from dpcomm.runtime.records import Span
    from dpcomm.train.config import TrainConfig

__all__ = [
    "DEFAULT_KIND",
    "Replica",
    "ReplicaContext",
    "ReplicaKind",
    "check_schedule",
    "kind_of",
    "kinds",
    "make_replica",
    "register_kind",
    "server_ranks",
]

DEFAULT_KIND = "dpcomm"
"""The kind of every schedule whose name no kind registered: dpcomm's runtime with a planner's plan."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaContext:
    """Everything a replica is built from (the same on every rank but ``rank``)."""

    cfg: TrainConfig
    """The run's configuration."""
    schedule: str
    """The schedule as written (``mgwfbp``, ``bucket:25MB``, ``ddp``)."""
    parsed: Any
    """What the kind's ``check`` returned for ``schedule`` (parsed once, in the parent process)."""
    rank: int
    """This worker's rank, 0..world-1."""
    world: int
    """Processes in the run: the ``workers`` and, where the kind declares them, ``servers``."""
    state: dict[str, Any] | None
    """The checkpoint being resumed (iteration, model, optimizer, plan, replica), if any."""
    servers: int = 0
    """Server ranks (:attr:`ReplicaKind.servers`): the last ``servers`` ranks train nothing; they get no
    batch (``iteration(None, None)``) and their loss is not counted."""

    @property
    def workers(self) -> int:
        """Ranks that train (``world - servers``): ranks ``0..workers-1``."""
        return self.world - self.servers


@runtime_checkable
class Replica(Protocol):
    """One schedule's model, optimizer and gradient communication on one rank (see the module docstring)."""

    schedule: str
    """The schedule as written."""
    model: nn.Module
    optimizer: Optimizer
    start: int
    """First iteration this replica runs (the checkpoint's iteration when resuming, else 0)."""
    loss: float
    """This rank's loss in the last iteration (nan before the first)."""
    records: list[dict[str, Any]]
    """One dict per iteration (see point 3 of the module docstring)."""
    log: list[str]
    """One-line messages for the user."""

    def iteration(self, x: Any, y: Any) -> float:
        """One synchronous SGD iteration on this rank's batch; returns the loss."""
        ...

    @property
    def plan(self) -> Plan | None:
        """The plan to save in a checkpoint (None: none, or not decided yet)."""
        ...

    @property
    def settled(self) -> bool:
        """Whether the plan is final (kept): False while a planner-name plan is being profiled or timed.
        Periodic checkpoints wait for it, so every checkpoint but a run's last holds the plan that was kept
        and a resumed run continues exactly as the interrupted one would have."""
        ...

    def checkpoint_state(self) -> dict[str, Any]:
        """Further state to checkpoint (``{}`` for none); returned on resume as ``state["replica"]``."""
        ...

    def spans(self) -> list[list[Span]]:
        """This rank's timeline of its last iterations, one list of spans per iteration."""
        ...

    def finish(self) -> None:
        """After the last iteration (every rank): make every replica's parameters current."""
        ...

    def params_sha256(self) -> str:
        """sha256 of this rank's parameters (names and bytes)."""
        ...

    def result_fields(self) -> dict[str, Any]:
        """TrainResult fields this kind measured: ``collective`` always; ``trace``, ``cost``,
        ``grad_buffer_bytes`` where known."""
        ...

    def close(self) -> None:
        """Release hooks, threads and sockets (the model stays usable)."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaKind:
    """A kind of replica: how to check a schedule of this kind and how to build one."""

    name: str
    """The schedule name that selects it (text before the first ``:``), or :data:`DEFAULT_KIND`."""
    build: Callable[[ReplicaContext], Replica]
    """Builds this rank's replica (in the worker)."""
    check: Callable[[TrainConfig, str], Any]
    """Validates the schedule against the config in the parent, before any worker starts; raises a one-line
    :class:`~dpcomm.errors.UserError` or returns the parsed schedule (given to ``build`` as ``parsed``).
    Must be picklable (a module-level function): the result travels to the workers."""
    summary: str = ""
    """One line for help texts (``ddp``: PyTorch DDP baseline)."""
    servers: Callable[[Any], int] | None = None
    """Rank roles: ``servers(parsed)`` is how many ranks beyond the workers this schedule needs that train
    nothing (a parameter server's dedicated servers); None: none. The loop starts ``workers + servers``
    processes, servers last (:func:`server_ranks`)."""


_KINDS: dict[str, ReplicaKind] = {}


def register_kind(kind: ReplicaKind) -> ReplicaKind:
    """Add a kind (a second registration of the same name replaces the first); returns it."""
    _KINDS[kind.name] = kind
    return kind


def _builtin() -> None:
    """Register the built-in kinds. Real imports (no module names in strings), so the layering test sees
    the edges: ``dpcomm.train`` imports ``dpcomm.ps`` and ``dpcomm.ddp``, never the other way. Workers are
    fresh processes: a kind registered only in the parent would be unknown there, so a new built-in kind's
    module is imported here (on first use: they import torch)."""
    from dpcomm.train import ddp_plan_replica, dp_replica, fsdp_replica, ps_replica  # noqa: F401 - registers the kinds


def kinds() -> dict[str, ReplicaKind]:
    """Every registered kind by name (the built-in ones included)."""
    if DEFAULT_KIND not in _KINDS:
        _builtin()
    return dict(_KINDS)


def kind_of(schedule: str) -> ReplicaKind:
    """The kind that runs ``schedule``: the one registered under its name, else :data:`DEFAULT_KIND`."""
    table = kinds()
    name = str(schedule).strip().partition(":")[0].strip()  # exact: "DDP" is not "ddp"
    return table.get(name, table[DEFAULT_KIND])


def check_schedule(cfg: TrainConfig, schedule: str) -> Any:
    """The kind's check of ``schedule`` (a one-line UserError, or the parsed schedule)."""
    return kind_of(schedule).check(cfg, schedule)


def server_ranks(schedule: str, parsed: Any) -> int:
    """Ranks beyond the workers that ``schedule`` needs (its kind's :attr:`ReplicaKind.servers`)."""
    count = kind_of(schedule).servers
    return int(count(parsed)) if count is not None else 0


def make_replica(ctx: ReplicaContext) -> Replica:
    """Build this rank's replica for ``ctx.schedule``."""
    return kind_of(ctx.schedule).build(ctx)
