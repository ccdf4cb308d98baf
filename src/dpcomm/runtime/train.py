"""``dpcomm train`` as a library: real S-SGD training on P workers with a plan, PyTorch DDP as the baseline.

``train(TrainConfig(...))`` validates everything a user can get wrong *before* any worker starts (model,
schedule, collective, mode, sizes, the checkpoint folder and, with ``resume``, the checkpoint itself), then
starts the workers through :func:`dpcomm.launch.launch` (torch's elastic agent: c10d rendezvous on
127.0.0.1, or a static one at ``master_addr`` across machines, as ``torchrun`` does). Every worker runs:

1. build the zoo model with ``torch.manual_seed(seed)`` (rank 0's copy is broadcast anyway), momentum SGD;
2. wrap it: :class:`dpcomm.DataParallel` with the schedule (a planner name is profiled on the first
   ``profile_iters`` iterations and then planned; MG-WFBP Alg. 1-2), or, for ``ddp``, PyTorch's own
   ``DistributedDataParallel`` with its default buckets (25 MB, first bucket 1 MB);
3. per iteration ``i``: reseed torch from ``(seed, rank, i)`` (dropout masks), take this rank's batch
   (:class:`dpcomm.runtime.data.TrainData`, a function of ``(seed, epoch, i)``), forward, loss, backward,
   step; rank 0 saves a checkpoint every ``checkpoint_every`` iterations and at the end.

Because data order and randomness depend only on ``(seed, rank, iteration)``, and the checkpoint holds the
model, the optimizer and the plan in use, a resumed run ends with bitwise the same parameters as an
uninterrupted one. (If the checkpoint was written while a planner-name plan was still being profiled,
the resumed run profiles the remaining iterations itself; the plan, and so the bits for P >= 3, may then
differ for timing-dependent schedules such as ``mgwfbp``/``optimal``.)

:func:`compare_schedules` trains one replica per schedule in the *same* workers, interleaved iteration by
iteration on the same batches, so the schedules see the same machine load: the demo and the benchmark use it.

Timing names follow MG-WFBP Sec. III: ``t_iter`` (median iteration), forward ``t_f``, backward ``t_b`` and
the exposed (non-overlapped) communication. For DDP the exposed part is measured with a comm hook that is
PyTorch's default all-reduce hook plus a timestamp: the time from the last bucket becoming ready (end of
backward computation) to ``backward()`` returning.

Test hook: ``DPCOMM_TEST_KILL="RANK:ITER"`` in the environment makes that rank ``os._exit(17)`` at the start
of that iteration (used by the tests to check that the others fail cleanly instead of hanging).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from dpcomm.errors import UserError

__all__ = [
    "SCHEDULE_DDP",
    "TrainConfig",
    "TrainResult",
    "total_iterations",
    "validate",
    "train",
    "compare_schedules",
    "summary_table",
    "predict",
]

SCHEDULE_DDP = "ddp"
"""Schedule name of the baseline: PyTorch's DistributedDataParallel with its default buckets."""
DEFAULT_ITERS = 20
_KILL_ENV = "DPCOMM_TEST_KILL"
_SOURCE_LOCATION = re.compile(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\] ")
_KILL_EXIT = 17
_COMPAT_KEYS = ("model", "data", "seed", "batch_size", "world_size")  # must match to resume


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig:
    """One training run (``dpcomm train`` flags). Values are checked here; names in :func:`validate`."""

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
    """``synthetic`` (random tensors, throughput) or ``digits`` (scikit-learn's digits, test accuracy)."""
    seed: int = 0
    """Seeds the model, the data split and order, and dropout."""
    checkpoint: str | None = None
    """Folder for ``checkpoint.pt``, written by rank 0 every ``checkpoint_every`` iterations and at end."""
    checkpoint_every: int = 0
    """Iterations between checkpoints; 0: only at the end."""
    resume: bool = False
    """Continue from the checkpoint in ``checkpoint`` (it must exist and be intact)."""
    chrome_trace: str | None = None
    """Write a Chrome trace of the last iterations (compute and communication rows per rank) here."""
    profile_iters: int = 3
    """Iterations profiled before a planner-name plan is decided (MG-WFBP Alg. 1 lines 1-7)."""
    verify_iters: int = 3
    """``mgwfbp``/``optimal``: iterations each for timing the plan against ``single`` and DDP's buckets
    (the fastest is kept); 0: keep the planner's plan untimed."""
    nnodes: int = 1
    """Machines; > 1 uses a static rendezvous at ``master_addr:master_port`` (as ``torchrun``)."""
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    """0 picks a free port (single machine only)."""
    timeout_s: float = 60.0
    """A collective waiting longer than this for a peer fails (gloo group timeout), so nothing hangs."""
    threads: int | None = None
    """Torch intra-op threads per worker; default: ``$OMP_NUM_THREADS``, else CPU cores / local workers."""
    progress: bool = True
    """Show rank 0's progress bar on stderr (only when stderr is a terminal)."""

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise UserError(msg)

        need(self.nproc >= 1, f"--nproc must be >= 1, got {self.nproc}")
        need(self.batch_size >= 1, f"--batch-size must be positive, got {self.batch_size}")
        need(self.iters is None or self.epochs is None, "give --iters or --epochs, not both")
        need(self.iters is None or self.iters >= 1, f"--iters must be >= 1, got {self.iters}")
        need(self.epochs is None or self.epochs >= 1, f"--epochs must be >= 1, got {self.epochs}")
        need(self.epochs is None or self.data != "synthetic", "synthetic data has no epochs: use --iters")
        need(math.isfinite(self.lr) and self.lr > 0, f"--lr must be a positive number, got {self.lr}")
        need(0 <= self.momentum < 1, f"momentum must be in [0, 1), got {self.momentum}")
        need(self.checkpoint_every >= 0, f"--checkpoint-every must be >= 0, got {self.checkpoint_every}")
        need(not self.resume or bool(self.checkpoint), "--resume needs --checkpoint DIR")
        need(not self.checkpoint_every or bool(self.checkpoint), "--checkpoint-every needs --checkpoint DIR")
        need(self.profile_iters >= 1, f"profile iterations must be >= 1, got {self.profile_iters}")
        need(self.verify_iters >= 0, f"--verify-iters must be >= 0, got {self.verify_iters}")
        need(self.nnodes >= 1, f"--nnodes must be >= 1, got {self.nnodes}")
        need(0 <= self.node_rank < self.nnodes, f"--node-rank must be in 0..{self.nnodes - 1}")
        need(0 <= self.master_port < 65536, f"--master-port must be a port number, got {self.master_port}")
        need(self.nnodes == 1 or self.master_port > 0, "a multi-node run needs --master-port")
        need(self.timeout_s > 0, f"timeout must be positive, got {self.timeout_s}")
        need(self.threads is None or self.threads >= 1, f"threads must be >= 1, got {self.threads}")
        need(
            self.schedule != SCHEDULE_DDP or self.mode == "overlap",
            f"--schedule ddp runs PyTorch's DDP; --mode {self.mode} needs a dpcomm schedule",
        )
        need(
            self.schedule != SCHEDULE_DDP or self.collective == "native",
            f"--schedule ddp is PyTorch's all-reduce; --collective {self.collective} needs a dpcomm schedule",
        )

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainResult:
    """What a run measured (rank 0's timings; parameters hashed on every rank)."""

    nproc: int
    """World size P (all nodes)."""
    schedule: str
    collective: str
    mode: str
    model: str
    data: str
    batch_size: int
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

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object: exactly the documented keys, plus ``test_accuracy`` for digits."""
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
        return out


# ----------------------------------------------------------------------------- validation (no workers)


def total_iterations(cfg: TrainConfig) -> int:
    """Iterations the run ends at: ``iters``, or ``epochs`` times the batches per epoch of one rank."""
    if cfg.epochs is None:
        return cfg.iters if cfg.iters is not None else DEFAULT_ITERS
    from dpcomm.runtime.data import TrainData

    data = TrainData(cfg.data, **_data_args(cfg, rank=0))
    return cfg.epochs * data.batches_per_epoch


def _data_args(cfg: TrainConfig, rank: int) -> dict[str, Any]:
    from dpcomm.models import input_shape, num_classes

    return {
        "input_shape": input_shape(cfg.model),
        "num_classes": 10 if cfg.data == "digits" else num_classes(cfg.model),
        "batch_size": cfg.batch_size,
        "world_size": cfg.world_size,
        "rank": rank,
        "seed": cfg.seed,
    }


def _check_schedule(schedule: str) -> None:
    if schedule == SCHEDULE_DDP:
        return
    from dpcomm.planner import parse_schedules

    if len(parse_schedules(schedule)) != 1:
        raise UserError(f"one schedule per run, got {schedule!r}")


def _compat(cfg: TrainConfig) -> dict[str, Any]:
    return {"model": cfg.model, "data": cfg.data, "seed": cfg.seed, "batch_size": cfg.batch_size,
            "world_size": cfg.world_size, "schedule": cfg.schedule, "collective": cfg.collective,
            "mode": cfg.mode}  # fmt: skip


def validate(cfg: TrainConfig, schedules: list[str] | None = None) -> dict[str, Any] | None:
    """Check names, sizes and files without starting workers; returns the checkpoint to resume from (or None).

    Every problem is a one-line :class:`UserError`.
    """
    from dpcomm.collectives import names as collective_names
    from dpcomm.models import input_shape
    from dpcomm.runtime.bsp import MODES
    from dpcomm.runtime.checkpoint import check_writable, load_checkpoint
    from dpcomm.runtime.data import DATA_KINDS

    input_shape(cfg.model)  # unknown model -> UserError
    for s in schedules or [cfg.schedule]:
        _check_schedule(s)
    if cfg.collective not in collective_names():
        raise UserError(
            f"unknown collective {cfg.collective!r}; choose one of: {', '.join(collective_names())}"
        )
    if cfg.mode not in MODES:
        raise UserError(f"unknown mode {cfg.mode!r}; choose one of: {', '.join(MODES)}")
    if cfg.data not in DATA_KINDS:
        raise UserError(f"unknown data {cfg.data!r}; choose one of: {', '.join(DATA_KINDS)}")
    if cfg.data == "digits":
        from dpcomm.runtime.data import TrainData

        TrainData(cfg.data, **_data_args(cfg, rank=0))  # the batch must fit the training set
    total = total_iterations(cfg)
    if cfg.chrome_trace:
        check_writable(os.path.dirname(os.path.abspath(cfg.chrome_trace)))
    if not cfg.checkpoint:
        return None
    check_writable(cfg.checkpoint)
    if not cfg.resume:
        return None
    state = load_checkpoint(cfg.checkpoint)  # corrupt -> UserError, nothing written
    if state is None:
        raise UserError(f"--resume: no checkpoint in {cfg.checkpoint}")
    saved = state.get("config", {})
    mine = _compat(cfg)
    for key in _COMPAT_KEYS:
        if saved.get(key) != mine[key]:
            raise UserError(
                f"--resume: checkpoint was made with {key}={saved.get(key)!r}, this run has {mine[key]!r}"
            )
    if state["iteration"] >= total:
        raise UserError(
            f"--resume: checkpoint is already at iteration {state['iteration']} of {total}; "
            "raise --iters/--epochs"
        )
    return state


# ----------------------------------------------------------------------------- the parent


def train(cfg: TrainConfig) -> TrainResult:
    """Validate, launch the workers, train ``cfg.schedule``; returns the run's :class:`TrainResult`."""
    validate(cfg)
    return _launch(cfg, [cfg.schedule])[0]


def compare_schedules(cfg: TrainConfig, schedules: list[str]) -> list[TrainResult]:
    """Train one replica per schedule in the same workers, interleaved per iteration on the same batches.

    Checkpoints are not written (``cfg.checkpoint`` must be unset); results in the order given.
    """
    if not schedules:
        raise UserError("no schedules to compare")
    if cfg.checkpoint or cfg.resume:
        raise UserError("checkpoints are for single-schedule runs (dpcomm train), not comparisons")
    validate(cfg, schedules)
    return _launch(cfg, list(schedules))


def _launch(cfg: TrainConfig, schedules: list[str]) -> list[TrainResult]:
    from dpcomm.launch import LaunchOptions, launch

    opts = LaunchOptions.of(cfg)
    spawn_log = logging.getLogger("torch.multiprocessing.spawn")  # "Terminating process ..." warnings
    level = spawn_log.level
    spawn_log.setLevel(logging.ERROR)
    try:
        per_rank = launch(_worker, opts, cfg, schedules)
    finally:
        spawn_log.setLevel(level)
    return [TrainResult(**r) for r in per_rank[0]]


# ----------------------------------------------------------------------------- the workers


def _worker(cfg: TrainConfig, schedules: list[str]) -> list[dict[str, Any]]:
    """One rank: train every schedule's replica, interleaved; returns one result dict per schedule."""
    import torch
    import torch.distributed as dist

    from dpcomm.launch import init_worker

    rank, world = init_worker("gloo", timeout_s=cfg.timeout_s)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", cfg.nproc))
    torch.set_num_threads(_threads(cfg, local))
    where = {"iteration": None}
    try:
        return _train_rank(cfg, schedules, rank, world, where)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - turn a lost peer / timeout into one clear line
        it = where["iteration"]
        at = f" at iteration {it}" if it is not None else ""
        raise RuntimeError(f"rank {rank} of {world} stopped{at}: {_first_line(exc)}") from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _threads(cfg: TrainConfig, local: int) -> int:
    """Torch threads per worker: ``--threads``, else ``$OMP_NUM_THREADS`` (as torchrun and ``testbed launch``
    set it when several workers share the cores), else the cores split among this machine's workers."""
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if cfg.threads:
        return cfg.threads
    if omp.isdigit() and int(omp) >= 1:
        return int(omp)
    return max(1, (os.cpu_count() or 1) // local)


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())  # one line
    text = _SOURCE_LOCATION.sub("", text)  # gloo prefixes "[/path/pair.cc:553] "; keep the readable part
    cut = text.find(". This is typically")
    text = text[:cut] if cut > 0 else text
    return f"{type(exc).__name__}: {text[:300]}"


class _Replica:
    """One schedule's model, optimizer and wrapper on this rank, with its per-iteration records."""

    def __init__(self, cfg: TrainConfig, schedule: str, rank: int, world: int, state: dict | None):
        import torch

        from dpcomm.models import get_model

        self.cfg, self.schedule, self.rank, self.world = cfg, schedule, rank, world
        torch.manual_seed(cfg.seed)
        self.model = get_model(cfg.model, 10 if cfg.data == "digits" else None)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        self._update = [0.0, 0.0]  # optimizer.step() start and duration (s): the model update time
        self.optimizer.register_step_pre_hook(lambda *_: self._update.__setitem__(0, time.perf_counter()))
        self.optimizer.register_step_post_hook(
            lambda *_: self._update.__setitem__(1, time.perf_counter() - self._update[0])
        )
        self.log: list[str] = []
        self.records: list[dict[str, Any]] = []
        self.spans: list[Any] = []  # DDP only: our own Chrome trace spans
        self.loss = float("nan")
        start = 0
        plan: Any = schedule
        profile_iters = cfg.profile_iters
        if state is not None:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            start = int(state["iteration"])
            if state.get("plan") is not None and schedule != SCHEDULE_DDP:
                from dpcomm.plan import Plan

                plan = Plan.from_dict(state["plan"])
            else:  # saved while profiling: profile only what is left, so the plan lands at the same iteration
                profile_iters = max(1, cfg.profile_iters - start)
        self.start = start
        if schedule == SCHEDULE_DDP:
            self._init_ddp()
        else:
            from dpcomm.runtime.data_parallel import DataParallel

            self.wrapper = DataParallel(
                self.model,
                plan=plan,
                collective=cfg.collective,
                mode=cfg.mode,
                profile_iters=profile_iters,
                verify_iters=cfg.verify_iters,
                log=self.log.append,
            )

    def _init_ddp(self) -> None:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        self.wrapper = DistributedDataParallel(self.model)  # default buckets: 25 MB, first 1 MB
        self._last_ready = 0.0
        world = self.world

        def hook(_state, bucket):  # no annotations: DDP insists they be GradBucket/Future if present
            # PyTorch's default allreduce_hook (divide by P, all-reduce, return the buffer) plus a timestamp:
            # the last bucket handed over marks the end of backward computation.
            self._last_ready = time.perf_counter()
            buf = bucket.buffer().div_(world)
            return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])

        self.wrapper.register_comm_hook(None, hook)
        self.log.append(
            f"[rank {self.rank}] DistributedDataParallel with default buckets (25 MB, first 1 MB)"
        )

    def iteration(self, x: Any, y: Any) -> None:
        import torch.nn.functional as F

        self.optimizer.zero_grad(set_to_none=True)
        self._update[1] = 0.0  # stays 0 where this rank does not step (lp-alg1/2 non-roots)
        if self.schedule != SCHEDULE_DDP:
            loss = F.cross_entropy(self.wrapper(x), y)
            loss.backward()
            self.wrapper.step(self.optimizer)
            self.records.append({**self.wrapper.records[-1].to_dict(), "update_s": self._update[1]})
        else:
            t0 = time.perf_counter()
            out = self.wrapper(x)
            t1 = time.perf_counter()
            loss = F.cross_entropy(out, y)
            loss.backward()
            t2 = time.perf_counter()
            self.optimizer.step()
            t3 = time.perf_counter()
            ready = min(max(self._last_ready, t1), t2)
            self.records.append(
                {"iteration": len(self.records), "forward_s": t1 - t0, "backward_s": ready - t1,
                 "exposed_comm_s": t2 - ready, "step_s": t3 - t2, "total_s": t3 - t0, "comm_s": None,
                 "plan": SCHEDULE_DDP, "update_s": self._update[1]}
            )  # fmt: skip
            self._ddp_spans(t0, t1, ready, t2, t3)
        self.loss = float(loss.detach())

    def _ddp_spans(self, t0: float, t1: float, ready: float, t2: float, t3: float) -> None:
        from dpcomm.runtime.records import Span

        wall = time.time() - time.perf_counter()
        rows = [("forward", "compute", t0, t1), ("backward", "compute", t1, ready),
                ("exposed all-reduce wait", "comm", ready, t2), ("step", "compute", t2, t3)]  # fmt: skip
        self.spans.append([Span(name=n, row=r, start=a + wall, end=b + wall) for n, r, a, b in rows])
        del self.spans[:-50]

    @property
    def plan(self) -> Any:
        return None if self.schedule == SCHEDULE_DDP else self.wrapper.plan

    def finish(self) -> None:
        """Make every replica current (``lp-alg1`` non-roots get the last update in the next forward)."""
        if self.schedule != SCHEDULE_DDP and self.cfg.mode == "lp-alg1":
            self.wrapper.sync_params()

    def params_sha256(self) -> str:
        h = hashlib.sha256()
        for name, p in self.model.named_parameters():
            h.update(name.encode())
            h.update(p.detach().contiguous().view(-1).view(dtype=_u8()).numpy().tobytes())
        return h.hexdigest()

    def grad_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if p.requires_grad)

    def grad_buffer_bytes(self) -> int | None:
        if self.schedule != SCHEDULE_DDP:
            return self.wrapper.grad_buffer_bytes
        sizes = self.wrapper._get_ddp_logging_data().get("bucket_sizes")  # "1051688, 12050944" (bytes)
        try:
            return sum(int(s) for s in str(sizes).split(",") if s.strip())
        except ValueError:
            return None


def _u8() -> Any:
    import torch

    return torch.uint8


def _train_rank(
    cfg: TrainConfig, schedules: list[str], rank: int, world: int, where: dict[str, Any]
) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist

    from dpcomm.runtime.data import TrainData, derive_seed

    state = None
    if cfg.resume:  # rank 0 reads the file (other nodes may not have it) and shares it
        from dpcomm.runtime.checkpoint import load_checkpoint

        box = [load_checkpoint(cfg.checkpoint) if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        state = box[0]
    data = TrainData(cfg.data, **_data_args(cfg, rank))
    total = total_iterations(cfg)
    replicas = [_Replica(cfg, s, rank, world, state) for s in schedules]
    start = replicas[0].start
    kill = _kill_point(rank)
    bar = _Progress(cfg, schedules, start, total) if rank == 0 else None
    try:
        for it in range(start, total):
            where["iteration"] = it
            if kill == it:
                os._exit(_KILL_EXIT)
            x, y = data.batch(it)
            for rep in replicas:
                torch.manual_seed(derive_seed(cfg.seed, rank, it))  # dropout: same masks for every schedule
                rep.iteration(x, y)
            if rank == 0:
                if cfg.checkpoint and (
                    it + 1 == total or (cfg.checkpoint_every and (it + 1) % cfg.checkpoint_every == 0)
                ):
                    _save(cfg, replicas[0], it + 1, data)
                if bar is not None:
                    bar.update(it + 1, replicas)
        where["iteration"] = None
    finally:
        if bar is not None:
            bar.close()
    return [_finish(cfg, rep, data, rank, world, start, total, len(replicas) > 1) for rep in replicas]


def _kill_point(rank: int) -> int | None:
    spec = os.environ.get(_KILL_ENV, "")
    if not spec:
        return None
    r, _, it = spec.partition(":")
    return int(it) if int(r) == rank else None


def _save(cfg: TrainConfig, rep: _Replica, iteration: int, data: Any) -> None:
    from dpcomm.runtime.checkpoint import save_checkpoint

    plan = rep.plan
    save_checkpoint(
        cfg.checkpoint,
        {
            "iteration": iteration,
            "config": _compat(cfg),
            "model": rep.model.state_dict(),
            "optimizer": rep.optimizer.state_dict(),
            "plan": plan.to_dict() if plan is not None else None,
            # data order is a function of (seed, epoch, iteration): this is the whole sampler state
            "sampler": {
                "seed": cfg.seed,
                "epoch": data.epoch_of(iteration),
                "batches_per_epoch": data.batches_per_epoch,
            },  # fmt: skip
            "loss": rep.loss,
        },
    )


def _finish(
    cfg: TrainConfig, rep: _Replica, data: Any, rank: int, world: int, start: int, total: int, multi: bool
) -> dict[str, Any]:
    import resource

    import torch
    import torch.distributed as dist

    rep.finish()
    loss = torch.tensor([rep.loss], dtype=torch.float64)
    dist.all_reduce(loss)
    shas: list[Any] = [None] * world
    dist.all_gather_object(shas, rep.params_sha256())
    accuracy = [None]
    if cfg.data == "digits":
        if rank == 0:
            accuracy[0] = _test_accuracy(rep.model, data)
        dist.broadcast_object_list(accuracy, src=0)
    trace_path = None
    if cfg.chrome_trace:
        trace_path = _write_trace(_trace_path(cfg.chrome_trace, rep.schedule, multi), rep, rank, world)
    steady = _steady(rep.records)
    t_iter = statistics.median(r["total_s"] for r in steady)
    plan = rep.plan
    dp = rep.wrapper if rep.schedule != SCHEDULE_DDP else None
    cost = None
    if dp is not None and dp.cost is not None:
        cost = {"a": getattr(dp.cost, "a", None), "b": getattr(dp.cost, "b", None),
                "points": [list(p) for p in dp.cost_points]}  # fmt: skip
    if dp is not None:
        dp.close()
    return {
        "nproc": world,
        "schedule": rep.schedule,
        "collective": "native" if rep.schedule == SCHEDULE_DDP else cfg.collective,  # DDP: torch's own
        "mode": cfg.mode,
        "model": cfg.model,
        "data": cfg.data,
        "batch_size": cfg.batch_size,
        "start_iteration": start,
        "iterations": total,
        "t_iter_s": t_iter,
        "forward_s": statistics.median(r["forward_s"] for r in steady),
        "backward_s": statistics.median(r["backward_s"] for r in steady),
        "exposed_comm_s": statistics.median(r["exposed_comm_s"] for r in steady),
        "exposed_share": _share(steady),
        "update_s": statistics.median(r["update_s"] for r in steady),
        "throughput_samples_s": cfg.batch_size * world / t_iter,
        "loss_final": float(loss.item() / world),
        "params_sha256": shas,
        "test_accuracy": accuracy[0],
        "plan": plan.to_dict() if plan is not None else None,
        "trace": dp.trace.to_dict() if dp is not None and dp.trace is not None else None,
        "cost": cost,
        "grad_bytes": rep.grad_bytes(),
        "grad_buffer_bytes": rep.grad_buffer_bytes(),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
        "log": rep.log,
        "records": rep.records,
        "chrome_trace": trace_path,
    }  # fmt: skip


def _share(records: list[dict[str, Any]]) -> float:
    """Exposed communication as a share of iteration time, over ``records``."""
    return sum(r["exposed_comm_s"] for r in records) / max(1e-12, sum(r["total_s"] for r in records))


def _steady(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Iterations that show the kept plan: after profiling and the timed candidates, never the very first."""
    steady = [
        r for r in records[1:] if r.get("plan") != "profiling" and not str(r.get("plan")).startswith("trial ")
    ]
    return steady or records


def _test_accuracy(model: Any, data: Any) -> float:
    import torch

    was = model.training
    model.eval()
    correct = seen = 0
    with torch.no_grad():
        for x, y in data.test_batches():
            correct += int((model(x).argmax(1) == y).sum())
            seen += len(y)
    model.train(was)
    return correct / max(1, seen)


def _trace_path(path: str, schedule: str, multi: bool) -> str:
    """``out.json`` for one schedule; ``out.<schedule>.json`` per schedule when several run together."""
    if not multi:
        return path
    base, ext = os.path.splitext(path)
    return f"{base}.{re.sub(r'[^A-Za-z0-9_-]+', '_', schedule)}{ext or '.json'}"


def _write_trace(path: str, rep: _Replica, rank: int, world: int) -> str | None:
    import torch.distributed as dist

    from dpcomm.runtime.records import write_chrome_trace_file

    if rep.schedule != SCHEDULE_DDP:
        out = rep.wrapper.write_chrome_trace(path)
    else:
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, [s for it in rep.spans for s in it])
        out = write_chrome_trace_file(path, dict(enumerate(everyone))) if rank == 0 else None
    return str(out) if out is not None else None


class _Progress:
    """Rank 0's rich progress bar on stderr: loss, throughput and exposed-communication share."""

    def __init__(self, cfg: TrainConfig, schedules: list[str], start: int, total: int):
        self._bar = None
        if not (cfg.progress and sys.stderr.isatty()):
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._global = cfg.batch_size * cfg.world_size
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.4f}"),
            TextColumn("{task.fields[tput]:>8.1f} samples/s"),
            TextColumn("comm exposed {task.fields[exposed]:>4.0%}"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self._tasks = [
            self._bar.add_task(s, total=total, completed=start, loss=float("nan"), tput=0.0, exposed=0.0)
            for s in schedules
        ]
        self._bar.start()

    def update(self, done: int, replicas: list[_Replica]) -> None:
        if self._bar is None:
            return
        for task, rep in zip(self._tasks, replicas, strict=True):
            recent = rep.records[-10:]
            t = statistics.median(r["total_s"] for r in recent)
            exposed = _share(recent)
            self._bar.update(task, completed=done, loss=rep.loss, tput=self._global / t, exposed=exposed)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


# ----------------------------------------------------------------------------- summary


def predict(result: TrainResult, steady_compute: bool = False) -> Any:
    """The simulator's :class:`~dpcomm.sim.SimResult` for the run's own profiled trace, plan and measured
    all-reduce cost (``T(M) = a + b*M``), plus its measured optimizer time; None for DDP or when the plan
    was given rather than profiled.

    ``steady_compute=True`` first scales the trace's forward and backward layer times so that their sums
    equal the run's steady-state medians ``t_f`` and ``t_b`` (the profiled iterations may have run under a
    different machine load): the remaining error is then the communication model's and the overlap's.
    """
    if result.trace is None or result.plan is None or not result.cost or result.cost.get("a") is None:
        return None
    from dpcomm.costmodel.base import LinearCost
    from dpcomm.plan import Plan
    from dpcomm.sim import simulate
    from dpcomm.trace.format import trace_from_dict

    obj = result.trace
    if steady_compute:
        t_f = sum(layer["forward_s"] for layer in obj["layers"]) or 1.0
        t_b = sum(layer["backward_s"] for layer in obj["layers"]) or 1.0
        sf, sb = result.forward_s / t_f, result.backward_s / t_b
        layers = [{**layer, "forward_s": layer["forward_s"] * sf, "backward_s": layer["backward_s"] * sb}
                  for layer in obj["layers"]]  # fmt: skip
        obj = {**obj, "layers": layers}
    cost = LinearCost(result.cost["a"], result.cost["b"])
    return simulate(
        trace_from_dict(obj), Plan.from_dict(result.plan), cost, result.nproc, update_s=result.update_s
    )


def summary_table(results: list[TrainResult], title: str = "dpcomm train") -> Any:
    """A rich table: one row per schedule with the timings, loss, accuracy and agreement of the replicas."""
    from rich.table import Table

    base = next((r for r in results if r.schedule == SCHEDULE_DDP), None)
    accuracy = any(r.test_accuracy is not None for r in results)
    cols = ["schedule", "collective", "P", "t_iter ms", "t_f ms", "t_b ms", "exposed ms", "exposed %",
            "samples/s", "loss"]  # fmt: skip
    cols += ["vs DDP"] * (base is not None) + ["test acc"] * accuracy + ["replicas"]
    table = Table(title=title)
    for col in cols:
        table.add_column(col, justify="left" if col in ("schedule", "collective", "replicas") else "right")
    for r in results:
        row = [
            r.schedule if r.mode == "overlap" else f"{r.schedule} ({r.mode})",
            r.collective,
            str(r.nproc),
            f"{r.t_iter_s * 1e3:.1f}",
            f"{r.forward_s * 1e3:.1f}",
            f"{r.backward_s * 1e3:.1f}",
            f"{r.exposed_comm_s * 1e3:.1f}",
            f"{r.exposed_share:.0%}",
            f"{r.throughput_samples_s:.1f}",
            f"{r.loss_final:.4f}",
        ]
        if base is not None:
            row.append(f"{r.t_iter_s / base.t_iter_s:.3f}")
        if accuracy:
            row.append(f"{r.test_accuracy:.1%}" if r.test_accuracy is not None else "-")
        row.append("identical" if len(set(r.params_sha256)) == 1 else "DIFFER")
        table.add_row(*row)
    return table
