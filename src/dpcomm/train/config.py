"""The typed configuration of a training run and the result it reports (`dpcomm train` flags, `--json`).

:class:`TrainConfig` has one field per flag of ``dpcomm train`` (``--batch-size`` is ``batch_size``,
``--timeout`` is ``timeout_s``); values are checked in ``__post_init__``, names and files once, before any
worker starts, by :func:`dpcomm.train.checks.validate`. Timing names follow MG-WFBP Sec. III: ``t_iter``,
forward ``t_f``, backward ``t_b`` and the exposed (non-overlapped) communication ``t_c^no``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dpcomm.errors import UserError
from dpcomm.launch import check_launch

__all__ = [
    "COMPAT_KEYS",
    "DEFAULT_ITERS",
    "DTYPES",
    "torch_dtype",
    "SCHEDULE_DDP",
    "autocast_context",
    "TrainConfig",
    "TrainResult",
    "compat",
    "data_args",
    "total_iterations",
]

SCHEDULE_DDP = "ddp"
"""Schedule name of the baseline: PyTorch's DistributedDataParallel with its default buckets."""
DEFAULT_ITERS = 20
"""Iterations when neither ``iters`` nor ``epochs`` is given."""
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}
"""``--dtype`` spellings and the torch dtype each names."""
COMPAT_KEYS = ("model", "data", "seed", "batch_size", "world_size", "dtype", "param_dtype", "reduce_dtype")
"""Config facts a checkpoint must share with the run that resumes it (``param_dtype``/``reduce_dtype``:
FSDP2's mixed-precision policy, None in checkpoints made without one)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig:
    """One training run: one field per ``dpcomm train`` flag (the CLI fills it by field name). Values are
    checked here; names, files and the schedule in :func:`dpcomm.train.checks.validate`."""

    model: str = "lenet5"
    """Zoo name (:func:`dpcomm.models.model_names`)."""
    nproc: int = 1
    """Workers on this machine (P per node)."""
    schedule: str = "mgwfbp"
    """Planner name (wfbp, single, bucket:SIZE, mgwfbp, optimal) or ``ddp`` (PyTorch DDP baseline)."""
    collective: str = "native"
    """All-reduce algorithm (:func:`dpcomm.collectives.names`); ignored by ``ddp``."""
    mode: str = "overlap"
    """``overlap`` (MG-WFBP Alg. 2) or the LP paper's ``lp-alg1``/``lp-alg2``/``lp-alg3``."""
    iters: int | None = None
    """Total iterations (counted from 0 even when resuming); default 20 unless ``epochs`` is given."""
    epochs: int | None = None
    """Total epochs over the training set (``digits`` only)."""
    batch_size: int = 32
    """Samples per worker per iteration (the global batch is ``batch_size * world_size``)."""
    lr: float = 0.05
    """SGD learning rate."""
    momentum: float = 0.9
    """SGD momentum."""
    data: str = "synthetic"
    """``synthetic`` (random tensors, throughput), ``digits`` (scikit-learn's digits, test accuracy) or
    ``text`` (the Python standard library's source as bytes, next-byte targets: decoders)."""
    seed: int = 0
    """Seeds the model, the data split and order, and dropout."""
    checkpoint: str | None = None
    """Folder for ``checkpoint.pt``, written by rank 0 every ``checkpoint_every`` iterations and at end."""
    checkpoint_every: int = 0
    """Iterations between checkpoints; 0: only at the end."""
    resume: bool = False
    """Continue from the checkpoint in ``checkpoint`` (it must exist and be intact)."""
    overwrite: bool = False
    """Start afresh over an existing checkpoint in ``checkpoint`` (without it, or ``resume``, an existing
    checkpoint, even a corrupt one, is an error: nothing writes over it unasked)."""
    chrome_trace: str | None = None
    """Write a Chrome trace of the last iterations (compute and communication rows per rank) here."""
    records_json: str | None = None
    """Write rank 0's log and per-iteration records (and the plan) here as JSON, atomically (node 0 only)."""
    profile_iters: int = 3
    """Iterations profiled before a planner-name plan is decided (MG-WFBP Alg. 1 lines 1-7)."""
    verify_iters: int = 3
    """``mgwfbp``/``optimal``: iterations each for timing the plan against ``single`` and DDP's buckets
    (the fastest is kept); 0: keep the planner's plan untimed."""
    dtype: str = "float32"
    """Parameter, gradient and activation dtype: ``float32`` or ``bfloat16`` (``bf16``; pure low-precision
    parameters, so every gradient travels as 2 bytes and the online planners price it so). The parameter
    server runs ``float32`` only."""
    memory: str | None = None
    """``fsdp:`` schedules: the budget of unsharded parameter bytes (``64MB`` = 64 MiB) their planner must
    fit (:mod:`dpcomm.train.fsdp_replica`); a schedule's own ``memory=`` and this are not both given."""
    param_dtype: str | None = None
    """``fsdp:``/``hsdp:`` schedules: FSDP2's ``MixedPrecisionPolicy(param_dtype=...)`` (``bf16``,
    ``fp16``, ``fp32``): units gathered and computed in it, parameters kept in ``dtype``; None: none."""
    reduce_dtype: str | None = None
    """``fsdp:``/``hsdp:`` schedules: the policy's ``reduce_dtype`` (gradients reduced in it; None:
    ``param_dtype``)."""
    compile: str | None = None
    """``torch.compile`` backend (``inductor``, ``aot_eager``, ...) for the ``ddp`` and ``fsdp:`` kinds: DDP
    wraps the compiled model (its plan cut where the graph can be, :mod:`dpcomm.ddp.compiled`), FSDP2
    compiles each unit after sharding; None: eager."""
    compiled_autograd: bool = False
    """``ddp`` kinds with ``compile="inductor"``: compiled autograd (``optimize_ddp="python_reducer"``, each
    backward traced with DDP's all-reduces in it and compiled by inductor, whose post-grad pass fuses them:
    DDP's greedy 25 MB buckets for ``ddp``, the plan's groups for ``ddp:PLANNER``, :mod:`dpcomm.ddp.
    compiled_autograd`); False: compiled DDP (``DDPOptimizer``) when ``compile`` is given."""
    probe_overlap: bool = False
    """``ddp:PLANNER``: after planning, measure how much backward slows per byte all-reduced beside it
    (:mod:`dpcomm.ddp.overlap_probe`, ``2 * 3 + 1`` extra training passes of a copy) and charge it in
    ``predicted_t_iter_s`` (:func:`dpcomm.sim.slowdown.overlap_slowed`); the plan is not changed."""
    replan_every: int = 0
    """Re-plan every this many steady iterations (dpcomm's runtime with a planner name): time the layers
    and the all-reduce again, plan on the root, switch when the model predicts a gain (see
    :mod:`dpcomm.train.replan`); 0: plan once."""
    nnodes: int = 1
    """Machines; > 1 uses a static rendezvous at ``master_addr:master_port`` (as ``torchrun``)."""
    node_rank: int = 0
    """This machine's rank among ``nnodes``."""
    master_addr: str = "127.0.0.1"
    """Rendezvous host (multi-node)."""
    master_port: int = 0
    """0 picks a free port (single machine only)."""
    timeout_s: float = 60.0
    """A collective waiting longer than this for a peer fails (gloo group timeout), so nothing hangs."""
    threads: int | None = None
    """Torch intra-op threads per worker; default: ``$OMP_NUM_THREADS``, else CPU cores / local workers."""
    progress: bool = True
    """Show rank 0's progress bar on stderr (only when stderr is a terminal)."""
    device: str = "cpu"
    """``cpu`` (gloo workers) or ``cuda``: one process per GPU under NCCL (``--nproc`` GPUs on each machine,
    :mod:`dpcomm.devices`), for ``ddp``, ``ddp:PLANNER`` and ``fsdp:PLANNER``."""
    autocast: str | None = None
    """``bf16`` or ``fp16``: every iteration under ``torch.autocast`` on the device (mixed precision: the
    parameters, gradients and their communication stay in ``dtype``); the layers are profiled under it too."""

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise UserError(msg)

        # the one launch check
        check_launch(self.nproc, self.nnodes, self.node_rank, self.master_port, master_addr=self.master_addr)
        need(self.batch_size >= 1, f"--batch-size must be positive, got {self.batch_size}")
        need(self.iters is None or self.epochs is None, "give --iters or --epochs, not both")
        need(self.iters is None or self.iters >= 1, f"--iters must be >= 1, got {self.iters}")
        need(self.epochs is None or self.epochs >= 1, f"--epochs must be >= 1, got {self.epochs}")
        need(self.epochs is None or self.data != "synthetic", "synthetic data has no epochs: use --iters")
        need(math.isfinite(self.lr) and self.lr > 0, f"--lr must be a positive number, got {self.lr}")
        need(0 <= self.momentum < 1, f"momentum must be in [0, 1), got {self.momentum}")
        need(self.checkpoint_every >= 0, f"--checkpoint-every must be >= 0, got {self.checkpoint_every}")
        need(not self.resume or bool(self.checkpoint), "--resume needs --checkpoint DIR")
        need(not (self.resume and self.overwrite), "give --resume or --overwrite, not both")
        need(not self.checkpoint_every or bool(self.checkpoint), "--checkpoint-every needs --checkpoint DIR")
        need(self.profile_iters >= 1, f"profile iterations must be >= 1, got {self.profile_iters}")
        need(self.verify_iters >= 0, f"--verify-iters must be >= 0, got {self.verify_iters}")
        need(self.replan_every >= 0, f"--replan-every must be >= 0 (0: off), got {self.replan_every}")
        need(self.timeout_s > 0, f"timeout must be positive, got {self.timeout_s}")
        need(self.threads is None or self.threads >= 1, f"threads must be >= 1, got {self.threads}")
        need(self.dtype in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        self._check_device()
        for flag, v in (("--param-dtype", self.param_dtype), ("--reduce-dtype", self.reduce_dtype)):
            need(v is None or v in DTYPES or v in ("fp16", "float16"),
                 f"{flag} must be one of {', '.join(DTYPES)}, fp16, float16, got {v!r}")  # fmt: skip
        need(
            not self.compiled_autograd or self.compile == "inductor",
            "--compiled-autograd needs --compile inductor: only inductor fuses the all-reduces compiled "
            f"autograd traces into the backward, got --compile {self.compile or '(none)'}",
        )
        need(
            not (self.compiled_autograd and self.replan_every),
            "--compiled-autograd with --replan-every: a new DDP would reuse the backward compiled for the "
            "old plan",
        )
        need(
            self.compile is None or not self.replan_every,
            "--compile with --replan-every: a new DDP would reuse the graphs dynamo split for the old plan",
        )
        need(
            self.compile is None or (self.compile.replace("_", "").isalnum() and self.compile.islower()),
            f"--compile takes a torch.compile backend name (inductor, aot_eager), got {self.compile!r}",
        )

    def _check_device(self) -> None:
        from dpcomm.devices import check_device

        if self.autocast is not None:
            from dpcomm.trace.profiler import AUTOCAST

            if self.autocast.strip().lower() not in AUTOCAST:
                raise UserError(f"--autocast must be one of {', '.join(AUTOCAST)}, got {self.autocast!r}")
        if self.device == "cuda" and not (
            self.schedule == SCHEDULE_DDP or self.schedule.startswith(("ddp:", "fsdp:"))
        ):
            raise UserError(
                f"--device cuda runs ddp, ddp:PLANNER and fsdp:PLANNER; --schedule {self.schedule} runs "
                "dpcomm's own runtime, on the CPU"
            )
        check_device(self.device, self.nproc)  # no GPU, or fewer than --nproc: one line, before any worker

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainResult:
    """What a run measured (rank 0's timings; parameters hashed on every rank)."""

    nproc: int
    """World size P (all nodes)."""
    schedule: str
    """The schedule as given."""
    collective: str
    """What moved the gradients (``native`` for DDP: torch's own all-reduce)."""
    mode: str
    """``overlap`` or an LP mode."""
    model: str
    """Zoo name."""
    data: str
    """``synthetic`` or ``digits``."""
    batch_size: int
    """Samples per worker per iteration."""
    start_iteration: int
    """First iteration run (> 0 when resumed)."""
    iterations: int
    """Total iterations reached."""
    t_iter_s: float
    """Median iteration time over the steady iterations (after profiling and the timed candidate plans /
    DDP's first iteration)."""
    forward_s: float
    """Median forward time (t_f)."""
    backward_s: float
    """Median backward computation time (t_b)."""
    exposed_comm_s: float
    """Median communication time not hidden behind backward (MG-WFBP t_c^no)."""
    exposed_share: float
    """Exposed communication / iteration time, summed over the steady iterations."""
    update_s: float
    """Median time of ``optimizer.step()`` (the model update), seconds."""
    throughput_samples_s: float
    """``batch_size * P / t_iter``."""
    loss_final: float
    """Mean over ranks of the last iteration's loss."""
    params_sha256: list[str]
    """sha256 of every rank's parameters, by rank (all equal when replicas agree bitwise)."""
    test_accuracy: float | None = None
    """Top-1 accuracy on the held-out digits (``digits`` only)."""
    plan: dict[str, Any] | None = None
    """The plan run (:meth:`Plan.to_dict`), None for DDP."""
    trace: dict[str, Any] | None = None
    """The measured trace a planner-name plan was made from (:mod:`dpcomm.trace.format` dict)."""
    cost: dict[str, Any] | None = None
    """The measured all-reduce cost: ``{"a": s, "b": s/byte, "points": [[bytes, s], ...]}``."""
    grad_bytes: int = 0
    """Bytes of the model's gradients (one copy)."""
    grad_buffer_bytes: int | None = None
    """Bytes of the runtime's flat gradient buffers (DDP: its buckets), the extra copy."""
    peak_rss_bytes: int = 0
    """Peak resident memory of rank 0's process."""
    log: list[str] = field(default_factory=list)
    """Rank 0's runtime messages (profiling, measurements, plan)."""
    records: list[dict[str, Any]] = field(default_factory=list)
    """Rank 0's per-iteration records (forward_s, backward_s, exposed_comm_s, step_s, total_s, ...)."""
    chrome_trace: str | None = None
    """The Chrome trace written (rank 0), if any."""
    compiled_buckets: list[list[str]] | None = None
    """``--compiled-autograd``, ``ddp:PLANNER``: the all-reduces the compiled backward ran, each as its
    parameters' names (graph order; ``ddp.dpcomm.compiled_buckets`` of the last backward graph compiled)."""
    compiled_allreduces: int | None = None
    """``--compiled-autograd``: how many all-reduces inductor's fusion left in the compiled backward (plain
    ``ddp``: inductor's greedy buckets, ``counters["inductor"]["ddp_buckets"]``)."""

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object: exactly the documented keys, plus ``test_accuracy`` for digits and
        ``compiled_allreduces``/``compiled_buckets`` under ``--compiled-autograd``."""
        out = {
            "nproc": self.nproc,
            "schedule": self.schedule,
            "collective": self.collective,
            "t_iter_s": self.t_iter_s,
            "throughput_samples_s": self.throughput_samples_s,
            "exposed_comm_s": self.exposed_comm_s,
            "loss_final": self.loss_final,
            "params_sha256": list(self.params_sha256),
        }
        if self.test_accuracy is not None:
            out["test_accuracy"] = self.test_accuracy
        if self.compiled_allreduces is not None:  # --compiled-autograd: the fused all-reduces
            out["compiled_allreduces"] = self.compiled_allreduces
        if self.compiled_buckets is not None:
            out["compiled_buckets"] = self.compiled_buckets
        return out


def torch_dtype(cfg: TrainConfig):
    """The torch dtype ``cfg.dtype`` names."""
    import torch

    return getattr(torch, DTYPES[cfg.dtype])


def autocast_context(cfg: TrainConfig):
    """``torch.autocast`` on the run's device in ``cfg.autocast``'s dtype; a null context without it."""
    import contextlib

    import torch

    if cfg.autocast is None:
        return contextlib.nullcontext()
    from dpcomm.trace.profiler import autocast_dtype

    return torch.autocast(cfg.device, dtype=autocast_dtype(cfg.autocast))


def total_iterations(cfg: TrainConfig) -> int:
    """Iterations the run ends at: ``iters``, or ``epochs`` times the batches per epoch of one rank."""
    if cfg.epochs is None:
        return cfg.iters if cfg.iters is not None else DEFAULT_ITERS
    from dpcomm.runtime.data import TrainData

    data = TrainData(cfg.data, **data_args(cfg, rank=0))
    return cfg.epochs * data.batches_per_epoch


def data_args(cfg: TrainConfig, rank: int) -> dict[str, Any]:
    """Keyword arguments of :class:`~dpcomm.runtime.data.TrainData` for ``rank``."""
    from dpcomm.models import input_shape, input_vocab, num_classes, per_token_targets

    return {
        "input_shape": input_shape(cfg.model),
        "num_classes": 10 if cfg.data == "digits" else num_classes(cfg.model),
        "vocab": input_vocab(cfg.model),
        "per_token": per_token_targets(cfg.model),
        "batch_size": cfg.batch_size,
        "world_size": cfg.world_size,
        "rank": rank,
        "seed": cfg.seed,
    }


def compat(cfg: TrainConfig) -> dict[str, Any]:
    """The config facts a checkpoint records (those in :data:`COMPAT_KEYS` must match to resume). The
    policy's dtypes by one name each (``bf16``), ``reduce_dtype`` as reduced (default: ``param_dtype``)."""
    from dpcomm.planner.fsdp_precision import Precision

    mp = Precision(param_dtype=cfg.param_dtype, reduce_dtype=cfg.reduce_dtype)
    return {"model": cfg.model, "data": cfg.data, "seed": cfg.seed, "batch_size": cfg.batch_size,
            "world_size": cfg.world_size, "dtype": DTYPES[cfg.dtype], "schedule": cfg.schedule,
            "collective": cfg.collective, "mode": cfg.mode, "param_dtype": mp.param_dtype,
            "reduce_dtype": mp.reduce_dtype or mp.param_dtype}  # fmt: skip
