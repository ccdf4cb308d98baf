"""Everything a user can get wrong in a training run, checked once in the parent before any worker starts:
model, schedule(s), collective, mode, data, sizes, the output paths, the checkpoint folder (an existing
checkpoint is never started over without ``overwrite``; temporaries a crashed write left are removed) and,
when resuming, the checkpoint.

Each schedule is checked (and parsed) once, by its replica kind (:func:`dpcomm.train.replica.check_schedule`);
the parsed schedules travel to the workers with the config. Every problem is a one-line
:class:`~dpcomm.errors.UserError`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from dpcomm.errors import UserError
from dpcomm.train.config import COMPAT_KEYS, TrainConfig, compat, data_args, total_iterations
from dpcomm.train.replica import check_schedule, server_ranks
from dpcomm.utils.io import check_output_path

__all__ = ["Checked", "check", "validate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Checked:
    """What the checks found: the schedules with what their kinds parsed, and the checkpoint to resume."""

    schedules: list[tuple[str, Any]]
    """``(schedule as written, parsed)`` per schedule, in the order given."""
    state: dict[str, Any] | None
    """The checkpoint to resume from (``resume``), else None."""
    servers: int = 0
    """Server ranks the schedules declare (:func:`dpcomm.train.replica.server_ranks`), started after the
    workers."""


def check(cfg: TrainConfig, schedules: list[str] | None = None) -> Checked:
    """Check ``cfg`` (and ``schedules``, default ``[cfg.schedule]``) without starting workers."""
    from dpcomm.collectives import resolve as resolve_collective
    from dpcomm.models import input_shape
    from dpcomm.runtime.bsp import MODES
    from dpcomm.runtime.checkpoint import (
        check_writable,
        checkpoint_path,
        load_checkpoint,
        remove_stale_temporaries,
    )
    from dpcomm.runtime.data import DATA_KINDS

    input_shape(cfg.model)  # unknown model -> UserError
    parsed = [(s, check_schedule(cfg, s)) for s in schedules or [cfg.schedule]]
    servers = _servers(parsed)
    odd = [s for s, _ in parsed if str(s).strip().split(":", 1)[0] not in ("ddp", "fsdp", "hsdp")]
    if cfg.compile is not None and odd:
        raise UserError(
            f"--compile runs PyTorch's DDP or FSDP2 compiled: use ddp[:PLANNER] or fsdp:PLANNER, not {odd[0]}"
        )
    if cfg.compiled_autograd:
        other = [s for s, _ in parsed if str(s).strip().split(":", 1)[0] != "ddp"]
        if other:
            raise UserError(
                f"--compiled-autograd runs PyTorch's DDP (its python reducer): use ddp or ddp:PLANNER, "
                f"not {other[0]}"
            )
        if cfg.collective != "native":
            raise UserError(
                "--compiled-autograd: DDP calls a comm hook per parameter there, not per bucket; "
                f"--collective {cfg.collective} cannot run, use native"
            )
    if cfg.probe_overlap and not any(str(s).strip().startswith("ddp:") for s, _ in parsed):
        raise UserError(
            "--probe-overlap measures for ddp:PLANNER's prediction; no ddp:PLANNER schedule is given"
        )
    sharded = any(str(s).strip().startswith(("fsdp:", "hsdp:")) for s, _ in parsed)
    if cfg.memory is not None and not sharded:
        raise UserError("--memory is the budget of fsdp:PLANNER schedules; none is given")
    if (cfg.param_dtype or cfg.reduce_dtype) and not sharded:
        raise UserError("--param-dtype/--reduce-dtype are FSDP2's mixed precision: give an fsdp: or hsdp: "
                        "schedule")  # fmt: skip
    if servers:
        from dpcomm import lifecycle

        lifecycle.check_nproc(cfg.nproc + servers)  # the last node starts its workers and the servers
    collective = resolve_collective(cfg.collective, what="--collective")  # an alias (bml) is its algorithm
    if collective == "bcube" and cfg.world_size > 1:  # BML needs P = n^k workers, known before any starts
        from dpcomm.topology import bcube_shape

        bcube_shape(cfg.world_size)
    if cfg.mode not in MODES:
        raise UserError(f"unknown mode {cfg.mode!r}; choose one of: {', '.join(MODES)}")
    if cfg.data not in DATA_KINDS:
        raise UserError(f"unknown data {cfg.data!r}; choose one of: {', '.join(DATA_KINDS)}")
    if cfg.data in ("digits", "text"):
        from dpcomm.runtime.data import TrainData

        TrainData(cfg.data, **data_args(cfg, rank=0))  # the batch must fit the training set
    total = total_iterations(cfg)
    for out in (cfg.chrome_trace, cfg.records_json):
        if out:
            check_output_path(out)  # a folder, say, fails now, not after the training
            check_writable(os.path.dirname(os.path.abspath(out)))
    if not cfg.checkpoint:
        return Checked(schedules=parsed, state=None, servers=servers)
    check_writable(cfg.checkpoint)
    remove_stale_temporaries(cfg.checkpoint)
    if not cfg.resume:
        if checkpoint_path(cfg.checkpoint).exists() and not cfg.overwrite:
            raise UserError(
                f"{checkpoint_path(cfg.checkpoint)} exists: continue it with --resume, "
                "or start afresh over it with --overwrite"
            )
        return Checked(schedules=parsed, state=None, servers=servers)
    state = load_checkpoint(cfg.checkpoint)  # corrupt -> UserError, nothing written
    if state is None:
        raise UserError(f"--resume: no checkpoint in {cfg.checkpoint}")
    saved = state.get("config", {})
    mine = compat(cfg)
    for key in COMPAT_KEYS:
        theirs = saved.get(key, "float32" if key == "dtype" else None)  # checkpoints before --dtype: float32
        if theirs != mine[key]:
            raise UserError(
                f"--resume: checkpoint was made with {key}={theirs!r}, this run has {mine[key]!r}"
            )
    if state["iteration"] >= total:
        raise UserError(
            f"--resume: checkpoint is already at iteration {state['iteration']} of {total}; "
            "raise --iters/--epochs"
        )
    return Checked(schedules=parsed, state=state, servers=servers)


def _servers(parsed: list[tuple[str, Any]]) -> int:
    """The server ranks of the run: every schedule declares the same count (0: none), since every rank
    runs every schedule's replica and a server rank trains nothing."""
    counts = {s: server_ranks(s, p) for s, p in parsed}
    if len(set(counts.values())) > 1:
        shown = ", ".join(f"{s} ({n})" for s, n in counts.items())
        raise UserError(f"schedules compared in one run need the same number of server ranks: {shown}")
    return next(iter(counts.values()), 0)


def validate(cfg: TrainConfig, schedules: list[str] | None = None) -> dict[str, Any] | None:
    """:func:`check`, returning only the checkpoint to resume from (or None)."""
    return check(cfg, schedules).state
