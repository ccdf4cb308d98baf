"""What a person looks at: rank 0's progress bar, the summary table, and the simulator's prediction of a
run (:func:`predict` replays the run's own profiled trace, plan and measured all-reduce cost in
:mod:`dpcomm.sim`)."""

from __future__ import annotations

import statistics
import sys
from typing import Any

from dpcomm.runtime.records import Phase
from dpcomm.train.config import SCHEDULE_DDP, TrainConfig, TrainResult

__all__ = ["Progress", "exposed_share", "predict", "steady", "summary_table"]


def exposed_share(records: list[dict[str, Any]]) -> float:
    """Exposed communication as a share of iteration time, over ``records``."""
    return sum(r["exposed_comm_s"] for r in records) / max(1e-12, sum(r["total_s"] for r in records))


def steady(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Iterations that show the kept plan: ``Phase.STEADY`` (after profiling and the timed candidates), never
    the very first; all of them if there are none such."""
    kept = [r for r in records[1:] if r["phase"] == Phase.STEADY]
    return kept or records


class Progress:
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

    def update(self, done: int, replicas: list[Any]) -> None:
        if self._bar is None:
            return
        for task, rep in zip(self._tasks, replicas, strict=True):
            recent = rep.records[-10:]
            t = statistics.median(r["total_s"] for r in recent)
            exposed = exposed_share(recent)
            self._bar.update(task, completed=done, loss=rep.loss, tput=self._global / t, exposed=exposed)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def predict(result: TrainResult, steady_compute: bool = False) -> Any:
    """The simulator's :class:`~dpcomm.sim.SimResult` for the run's own profiled trace, plan and measured
    all-reduce cost (``T(M) = a + b*M``), plus its measured optimizer time; None for DDP or when the plan
    was given rather than profiled.

    ``steady_compute=True`` first scales the trace's forward and backward layer times so that their sums
    equal the run's steady-state medians ``t_f`` and ``t_b`` (the profiled iterations may have run under a
    different machine load): the remaining error is then the communication model's and the overlap's.
    With ``overlap_per_byte_s`` in the cost (``--probe-overlap``, :mod:`dpcomm.ddp.overlap_probe`) and
    the profiled compute, backward is slowed by the bytes in flight beside it
    (:func:`dpcomm.sim.slowdown.overlap_slowed`).
    """
    if result.trace is None or result.plan is None or not result.cost or result.cost.get("a") is None:
        return None
    from dpcomm.costmodel.base import LinearCost
    from dpcomm.plan import Plan
    from dpcomm.planner.dear import split_cost
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
    cost = split_cost(LinearCost(result.cost["a"], result.cost["b"]), result.cost.get("halves"))
    trace, plan = trace_from_dict(obj), Plan.from_dict(result.plan)
    per_byte = result.cost.get("overlap_per_byte_s")
    if per_byte and not steady_compute:  # measured by --probe-overlap; a steady backward already has it
        from dpcomm.sim.slowdown import overlap_slowed

        return overlap_slowed(trace, plan, cost, result.nproc, per_byte, update_s=result.update_s)
    return simulate(trace, plan, cost, result.nproc, update_s=result.update_s)


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
