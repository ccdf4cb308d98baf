"""The validation cases: plain data, one :class:`Case` per launch on the emulated cluster.

A case is a topology, a link rate, a trace (the model is ``emulated:TRACE``: the trace's layers and
parameter sizes, forward and backward sleeping its times, :mod:`dpcomm.trace.emulated`), a collective, a
runtime mode and the schedules measured side by side in that one launch. Every case is network-bound:
at 100 Mbit/s one all-reduce of the model's gradients takes longer than its backward pass.

Schedule strings are ``dpcomm train --schedule``'s (:mod:`dpcomm.train.replica`): the runtime's planners
(``wfbp``, ``single``, ``bucket:SIZE``, ``mgwfbp``, ``optimal``), PyTorch DDP (``ddp``, ``ddp:PLANNER``), the
parameter server (``ps:all|layer|ibatch``, co-located) and FSDP2 (``fsdp:per-block|optimal``). ``mode`` is
the runtime's (``overlap`` or the LP paper's ``lp-alg3``), a run-wide setting, so an LP mode is a case of
its own; ``collective`` likewise (``native``, ``lp``, ``bcube``).

A case with ``model`` and ``compile`` is a compiled one: a zoo model's real compute, compiled with that
backend, under ``ddp:PLANNER`` (:func:`dpcomm.ddp.wrap` of the compiled model: planned on its compiled
times, the graph split at the plan's cuts), each schedule in a launch of its own.

A case with ``algorithms`` is a multi-GPU all-reduce case instead: servers of ``gpus`` ranks sharing their
NIC, talking over a loopback shaped to ``intra_rate`` (``dpcomm testbed up --gpus-per-server``), each
algorithm of :mod:`dpcomm.testbed.gpu_allreduce` (NCCL's ring with ``C`` channels, the hierarchical
all-reduce) timed at each of ``sizes`` (``iters`` timed calls after a warm-up), against the flow model's
schedule of the same name on the same cluster (``TestbedConfig.flow_topology``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from dpcomm.errors import UserError

__all__ = ["CASES", "EXTRA", "Case", "QUICK", "select"]

RUNTIME = ("wfbp", "single", "bucket:256KB", "mgwfbp", "optimal")
"""dpcomm's runtime schedules; 256 KB buckets split ResNet-20's 1.08 MB of gradients into five."""
DDP = ("ddp", "ddp:optimal")
PS = ("ps:all", "ps:layer", "ps:ibatch")
FSDP = ("fsdp:per-block", "fsdp:optimal")
ALL = RUNTIME + DDP + PS + FSDP


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One launch on the emulated cluster: every schedule of the case side by side."""

    name: str
    """Short unique name (letters, digits, ``-``): the result file is ``<out>/<name>.json``."""
    schedules: tuple[str, ...]
    """``dpcomm train --schedule`` strings, run interleaved iteration by iteration."""
    topology: str = "star:4"
    """``star:N`` or ``bcube:n,k`` (what :mod:`dpcomm.testbed` builds)."""
    rate: str = "100mbit"
    """Link rate each way (tc's units)."""
    trace: str = "resnet20-cpu-b32"
    """The shipped trace the emulated model follows."""
    collective: str = "native"
    """All-reduce algorithm of the runtime schedules (``dpcomm train --collective``)."""
    mode: str = "overlap"
    """``overlap`` or ``lp-alg3`` (``dpcomm train --mode``)."""
    batch_size: int = 32
    """Samples per worker (the emulated model reads only the batch size)."""
    iters: int = 30
    """Iterations per schedule: 3 profiled and 9 timed before the steady ones of ``mgwfbp``/``optimal``."""
    quick: bool = False
    """Part of ``--quick``."""
    note: str = ""
    """What the case is for (one line)."""
    gpus: int = 1
    """Ranks per server (the testbed's ``--gpus-per-server``)."""
    intra_rate: str | None = None
    """Each server's loopback rate, both directions together (``--intra-rate``); None: unshaped."""
    algorithms: tuple[str, ...] = ()
    """Multi-GPU all-reduces timed instead of training (:mod:`dpcomm.testbed.gpu_allreduce`)."""
    sizes: tuple[str, ...] = ()
    """All-reduce sizes of an ``algorithms`` case (binary units, ``4MB``)."""
    model: str | None = None
    """A zoo model trained with its real compute instead of the emulated ``trace`` (``dpcomm train
    --model``); what ``compile`` compiles."""
    compile: str | None = None
    """``torch.compile`` backend of a compiled case (``dpcomm train --compile``; ``ddp:PLANNER`` schedules
    only, each in a launch of its own: dynamo's graphs of one model class are shared by the replicas of a
    process, and a DDP's graph split for one plan would serve the next)."""

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c == "-" for c in self.name):
            raise UserError(f"bad case name {self.name!r} (letters, digits and '-')")
        if self.algorithms:
            if not self.sizes or self.schedules or not 1 <= self.iters <= 100:
                raise UserError(
                    f"case {self.name}: an all-reduce case takes sizes, no schedules, 1..100 iters"
                )
            return
        if not self.schedules:
            raise UserError(f"case {self.name}: no schedules")
        if self.compile is not None and (
            self.model is None or not all(s.strip().startswith("ddp:") for s in self.schedules)
        ):
            raise UserError(f"case {self.name}: a compiled case needs a model and ddp:PLANNER schedules")
        if self.iters < 16:
            raise UserError(f"case {self.name}: iters must be >= 16, got {self.iters}")

    @property
    def kind(self) -> str:
        """``allreduce`` (an ``algorithms`` case) or ``train``."""
        return "allreduce" if self.algorithms else "train"

    def to_dict(self) -> dict[str, Any]:
        d = {**asdict(self), "schedules": list(self.schedules)}
        for key in ("model", "compile"):  # a case without them reads as it did before these fields
            if d[key] is None:
                d.pop(key)
        if not self.algorithms:  # a training case's record reads as it did before these fields
            for key in ("gpus", "intra_rate", "algorithms", "sizes"):
                d.pop(key)
        else:
            d |= {"algorithms": list(self.algorithms), "sizes": list(self.sizes)}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Case:
        tuples = {k: tuple(d[k]) for k in ("schedules", "algorithms", "sizes") if k in d}
        return cls(**{**d, **tuples})


_GPU_ALGOS = ("nccl-ring:1", "hierarchical", "nccl-ring:2")
"""NCCL's ring over every rank (one channel, and two entering each server at different ranks) and the
hierarchical all-reduce (:mod:`dpcomm.testbed.gpu_allreduce`)."""
_R20 = "resnet20-cpu-b32"
_GPT = "gpt2-tiny-cpu-b16"
_LLAMA = "llama-tiny-cpu-b16"
_VIT = "vit-cifar-cpu-b32"

CASES: tuple[Case, ...] = (
    Case(name="r20-s4", schedules=ALL, quick=True, note="every schedule kind, ResNet-20 on star:4"),
    Case(name="r20-s4-1g", schedules=ALL, rate="1gbit", note="the same at 1 Gbit/s"),
    Case(name="gpt2-s4", schedules=ALL, trace=_GPT, batch_size=16, note="a transformer, 3.3 MB"),
    Case(name="llama-s4", schedules=RUNTIME + DDP, trace=_LLAMA, batch_size=16),
    Case(name="vit-s4", schedules=RUNTIME + DDP + PS, trace=_VIT),
    Case(name="r20-s3", schedules=RUNTIME + DDP + PS, topology="star:3", note="odd P"),
    Case(name="r20-s8", schedules=RUNTIME + DDP, topology="star:8", note="8 servers on 2 cores"),
    Case(name="gpt2-s8", schedules=RUNTIME + DDP, topology="star:8", trace=_GPT, batch_size=16),
    Case(name="r20-s4-200m", schedules=RUNTIME + DDP + FSDP, rate="200mbit"),
    Case(
        name="r20-s4-lp",
        schedules=("wfbp", "single", "mgwfbp", "optimal"),
        collective="lp",
        note="the LP paper's pipelined all-reduce",
    ),  # fmt: skip
    Case(
        name="r20-s4-alg3",
        schedules=("wfbp", "single", "bucket:256KB", "optimal"),
        mode="lp-alg3",
        note="the LP paper's fork-join all-reduce after backward",
    ),  # fmt: skip
    Case(
        name="r20-bc22",
        schedules=("wfbp", "single", "mgwfbp", "optimal"),
        topology="bcube:2,2",
        collective="bcube",
        note="BML on BCube(2,2), two NICs per server",
    ),  # fmt: skip
    Case(
        name="gpt2-bc22",
        schedules=("wfbp", "single", "mgwfbp", "optimal"),
        topology="bcube:2,2",
        trace=_GPT,
        batch_size=16,
        collective="bcube",
    ),  # fmt: skip
    # multi-GPU servers on the emulated cluster: 100 Mbit/s NICs, ranks of a server on a shaped loopback
    Case(
        name="g2-s2",
        schedules=(),
        topology="star:2",
        gpus=2,
        intra_rate="400mbit",
        algorithms=_GPU_ALGOS,
        sizes=("4MB", "16MB"),
        iters=3,
        note="2 servers x 2 ranks: the ring NIC-bound, the hierarchical all-reduce's intra phases bus-bound",
    ),  # fmt: skip
    Case(
        name="g2-s3",
        schedules=(),
        topology="star:3",
        gpus=2,
        intra_rate="400mbit",
        algorithms=_GPU_ALGOS,
        sizes=("4MB", "16MB"),
        iters=3,
        note="3 servers x 2 ranks",
    ),  # fmt: skip
    Case(
        name="g4-s2",
        schedules=(),
        topology="star:2",
        gpus=4,
        intra_rate="200mbit",
        algorithms=_GPU_ALGOS,
        sizes=("4MB", "16MB"),
        iters=3,
        note="2 servers x 4 ranks on a slower loopback: the ring is bus-bound",
    ),  # fmt: skip
    Case(
        name="g2-tiny",
        schedules=(),
        topology="star:2",
        gpus=2,
        intra_rate="400mbit",
        algorithms=("nccl-ring:1", "hierarchical"),
        sizes=("1MB",),
        iters=2,
        note="the multi-GPU end-to-end test's case (not in the default list)",
    ),  # fmt: skip
    # compiled DDP with dpcomm's plan (docs/compile.md): a real model, one launch per schedule
    Case(
        name="gpt2c-s2",
        schedules=("ddp:mgwfbp", "ddp:optimal"),
        topology="star:2",
        model="gpt2-tiny",
        compile="aot_eager",
        batch_size=96,
        note="compiled DDP (aot_eager) split at the plan's cuts, planned on the compiled model's times",
    ),  # fmt: skip
    Case(
        name="tinyc",
        schedules=("ddp:optimal",),
        topology="star:2",
        rate="1gbit",
        model="gpt2-tiny",
        compile="aot_eager",
        batch_size=4,
        iters=16,
        note="the compiled end-to-end test's case (not in the default list)",
    ),  # fmt: skip
    Case(
        name="tiny",
        schedules=("single", "optimal"),
        topology="star:2",
        rate="1gbit",
        iters=16,
        note="the end-to-end test's case (not in the default list)",
    ),  # fmt: skip
)
"""Every case (the default list is all but :data:`EXTRA`)."""

QUICK: tuple[str, ...] = tuple(c.name for c in CASES if c.quick)
EXTRA = ("r20-s4-1g", "tiny", "g2-tiny", "tinyc")
"""Cases left out of the default list: ``tiny``, ``g2-tiny`` and ``tinyc`` (the tests'), and ``r20-s4-1g``,
which is not network-bound (an all-reduce of ResNet-20's gradients takes 11 ms at 1 Gbit/s against a
backward of 80 ms: the exposed communication left is the CPU's, docs/validate.md)."""
_DEFAULT = tuple(c for c in CASES if c.name not in EXTRA)


def select(names: str | None = None, *, quick: bool = False) -> list[Case]:
    """The cases ``names`` (comma-separated, in that order) picks; default all but :data:`EXTRA`, or the
    quick ones. An unknown name is a one-line :class:`UserError`."""
    by = {c.name: c for c in CASES}
    if names:
        picked = [n.strip() for n in names.split(",") if n.strip()]
        unknown = [n for n in picked if n not in by]
        if unknown or not picked:
            raise UserError(
                f"unknown case(s) {', '.join(unknown) or repr(names)}; choose from: {', '.join(by)}"
            )
        return [by[n] for n in dict.fromkeys(picked)]
    return [c for c in _DEFAULT if c.quick] if quick else list(_DEFAULT)
