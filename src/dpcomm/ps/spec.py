"""What a parameter-server run is asked to do: placement, pull method, push grouping, sparsification.

Written as one schedule text so that a training run can compare several in one go:
``ps:METHOD[,servers=S][,push=wfbp|single][,sparsify=topk:RATIO][,pulls=send|request]`` (``ps:ibatch``,
``ps:optimal,servers=2,sparsify=topk:0.01``). ``servers=0`` (the default) is the co-located placement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from dpcomm.errors import UserError
from dpcomm.planner.pull import PULL_METHODS

__all__ = [
    "PROBES",
    "PULL_MODES",
    "PUSH_SCHEDULES",
    "Probe",
    "PsSpec",
    "PullMode",
    "Push",
    "parse_ps_schedule",
    "parse_sparsify",
]


class Push(StrEnum):
    """Push groupings: one push per layer as backward produces it (``wfbp``), or one after backward."""

    WFBP = "wfbp"
    SINGLE = "single"


class PullMode(StrEnum):
    """How a pull batch leaves a server (:data:`PULL_MODES`)."""

    SEND = "send"
    REQUEST = "request"


class Probe(StrEnum):
    """What the probe of a planned pull plan does (:data:`PROBES`)."""

    CONFIRM = "confirm"
    SLOWDOWN = "slowdown"
    NONE = "none"


PUSH_SCHEDULES = tuple(Push)
"""Push groupings, as text (:class:`Push`)."""

PULL_MODES = tuple(PullMode)
"""How a pull batch leaves a server: ``send``, every batch right after the update, back to back (the
messages pipeline, so a pull's start-up ``Ts`` is the transport's alone); ``request``, each batch when the
worker asks for it, one batch outstanding per worker (a request to each server holding part of it; the
paper's pull: the next batch is asked for once the last one arrived, so every pull pays a round trip;
:mod:`dpcomm.ps.node`)."""


PROBES = tuple(Probe)
"""``confirm`` (the default): the plan is kept unless the probe ran more than
:data:`dpcomm.planner.pull.CONFIRM_REL` slower than modelled, else the better of ``all`` and ``layer``
(:func:`dpcomm.planner.pull.confirm_plan`); ``slowdown``: fit the forward's slowdown while pulls are in
flight (``d``, :func:`dpcomm.planner.pull.fit_slowdown`) to the probe and plan again with it; ``none``: no
probe, the paper's model alone."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PsSpec:
    """One parameter-server configuration."""

    pull: str = "all"
    """Pull method: ``all``, ``layer``, ``ibatch`` or ``optimal`` (:mod:`dpcomm.planner.pull`)."""
    servers: int = 0
    """Dedicated server processes S (>= 1); 0: co-located, every worker also serves one shard."""
    push: Push = Push.WFBP
    """Gradient push grouping: ``wfbp`` (each layer as backward produces it) or ``single``."""
    sparsify: float | None = None
    """Top-k ratio in (0, 1] for pushes (error feedback keeps the rest on the worker); None: dense."""
    pulls: PullMode = PullMode.SEND
    """:data:`PULL_MODES`: servers send every batch after the update, or each on the worker's request."""
    probe_rounds: int = 3
    """Timed pull rounds (all-in-one and per layer) that measure ``Ts`` and ``Tt_i`` for ibatch/optimal."""
    probe: Probe = Probe.CONFIRM
    """ibatch/optimal (:data:`PROBES`): what a forward timed beside the pulls of the plan made under the
    paper's model does to that plan."""

    def __post_init__(self) -> None:
        if self.pull not in PULL_METHODS:
            raise UserError(f"unknown pull method {self.pull!r}: use one of {', '.join(PULL_METHODS)}")
        if self.servers < 0:
            raise UserError(f"--ps-servers must be >= 1, got {self.servers}")
        if self.push not in PUSH_SCHEDULES:
            raise UserError(f"unknown push grouping {self.push!r}: use one of {', '.join(PUSH_SCHEDULES)}")
        object.__setattr__(self, "push", Push(self.push))  # typed, whichever way it was given
        if self.sparsify is not None and not (math.isfinite(self.sparsify) and 0 < self.sparsify <= 1):
            raise UserError(f"sparsification ratio must be in (0, 1], got {self.sparsify}")
        if self.pulls not in PULL_MODES:
            raise UserError(f"unknown pull mode {self.pulls!r}: use one of {', '.join(PULL_MODES)}")
        object.__setattr__(self, "pulls", PullMode(self.pulls))
        if self.probe not in PROBES:
            raise UserError(f"unknown pull probe {self.probe!r}: use one of {', '.join(PROBES)}")
        object.__setattr__(self, "probe", Probe(self.probe))
        if self.probe_rounds < 1:
            raise UserError(f"probe rounds must be >= 1, got {self.probe_rounds}")

    @property
    def placement(self) -> str:
        return "dedicated" if self.servers else "colocated"

    def label(self) -> str:
        """The schedule text of this spec (``ps:ibatch,servers=2``)."""
        out = f"ps:{self.pull}"
        if self.servers:
            out += f",servers={self.servers}"
        if self.push != "wfbp":
            out += f",push={self.push}"
        if self.sparsify is not None:
            out += f",sparsify=topk:{self.sparsify:g}"
        if self.pulls != "send":
            out += f",pulls={self.pulls}"
        return out


def parse_sparsify(text: str | None) -> float | None:
    """``"topk:0.01"`` -> 0.01; None or ``""`` -> None; anything else is a one-line UserError."""
    if text is None or not str(text).strip():
        return None
    name, sep, arg = str(text).strip().partition(":")
    if name.strip().lower() != "topk" or not sep:
        raise UserError(f"--sparsify must be topk:RATIO with RATIO in (0, 1], got {text!r}")
    try:
        ratio = float(arg)
    except ValueError:
        raise UserError(f"--sparsify must be topk:RATIO with RATIO in (0, 1], got {text!r}") from None
    if not (math.isfinite(ratio) and 0 < ratio <= 1):
        raise UserError(f"sparsification ratio must be in (0, 1], got {text!r}")
    return ratio


def parse_ps_schedule(text: str) -> PsSpec:
    """``ps:METHOD[,servers=S][,push=P][,sparsify=topk:R][,pulls=M]`` -> :class:`PsSpec` (module
    docstring)."""
    kind, sep, rest = str(text).strip().partition(":")
    if kind.strip() != "ps" or not sep or not rest.strip():
        raise UserError(
            f"a parameter-server schedule is ps:METHOD[,servers=S][,sparsify=topk:R], got {text!r}"
        )
    method, *opts = [p.strip() for p in rest.split(",")]
    fields: dict[str, object] = {"pull": method.lower()}
    for opt in opts:
        key, eq, val = opt.partition("=")
        key = key.strip().lower()
        if not eq or key not in ("servers", "push", "sparsify", "pulls"):
            raise UserError(
                f"unknown option {opt!r} in {text!r}: use servers=S, push=wfbp|single, sparsify=topk:R, "
                "pulls=send|request"
            )
        if key == "servers":
            if not val.strip().lstrip("-").isdigit():
                raise UserError(f"servers must be an integer >= 1, got {val!r}")
            fields["servers"] = int(val)
            if fields["servers"] < 1:
                raise UserError(f"--ps-servers must be >= 1, got {val}")
        elif key in ("push", "pulls"):
            fields[key] = val.strip().lower()
        else:
            fields["sparsify"] = parse_sparsify(val)
    return PsSpec(**fields)  # type: ignore[arg-type]
