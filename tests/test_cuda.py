"""The GPU tier (``pytest -m cuda``; skipped with a reason where CUDA is absent, ``tests/conftest.py``) and
the CPU runs of its prepared script, ``benchmarks/gpu_check.py``, so that neither is dead code on a CPU.

One GPU holds what the tier runs: NCCL at world size 1 (in this process) and gloo on CUDA tensors for two
ranks sharing the GPU (NCCL refuses two ranks on one device). ``torch.cuda._sleep`` spins the GPU for a
number of cycles: work the host only queues, so a timing that does not wait for the device misses it.
Budget on CPU: the dry run in this process (seconds); one launch of 2 gloo workers (slow tier, ~30-60 s
on the 2-core VM).
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "benchmarks" / "gpu_check.py"
BUSY_S = 0.02
"""Seconds of GPU work ``_busy`` queues."""


def _gpu_check():
    """The script as a module (``benchmarks/`` is not a package)."""
    if "gpu_check" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_check", CHECK)
        sys.modules["gpu_check"] = importlib.util.module_from_spec(spec)  # its dataclass looks itself up
        spec.loader.exec_module(sys.modules["gpu_check"])
    return sys.modules["gpu_check"]


def _busy_cycles(seconds: float = BUSY_S) -> int:
    """``torch.cuda._sleep`` cycles that spin the GPU for about ``seconds`` (measured with CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10**7)
    end.record()
    end.synchronize()
    return int(10**7 * seconds / (start.elapsed_time(end) / 1e3))


@pytest.fixture
def nccl_one_rank():
    """NCCL at world size 1 in this process (what a single GPU allows)."""
    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda", 0)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------- the GPU tier


@pytest.mark.cuda
def test_time_calls_counts_the_kernels_a_call_queues():
    from dpcomm.timing import now, synchronize, time_calls

    cycles = _busy_cycles()
    timed = time_calls(lambda: torch.cuda._sleep(cycles), 3, barrier="none", device="cuda")
    host = []
    for _ in range(3):  # the host's clock alone: the call returns once the kernel is queued
        t0 = time.perf_counter()
        torch.cuda._sleep(cycles)
        host.append(time.perf_counter() - t0)
        synchronize("cuda")
    assert min(timed) >= 0.9 * BUSY_S > 2 * statistics.median(host), (timed, host)
    t0 = now("cuda")
    torch.cuda._sleep(cycles)
    assert now("cuda") - t0 >= 0.9 * BUSY_S


@pytest.mark.cuda
def test_nccl_at_world_size_one_times_collectives_on_the_gpu(nccl_one_rank):
    from dpcomm.planner.autoplan import measure_allreduce
    from dpcomm.timing import group_device, rank_input, slowest, time_calls, time_collective

    assert group_device().type == "cuda"  # NCCL takes CUDA tensors only: inputs and slowest() go there
    x = rank_input(1000, 0, device=group_device())
    dist.all_reduce(x)
    assert torch.equal(x.cpu(), rank_input(1000, 0))
    secs = time_collective(None, "allreduce", [4096, 1 << 20], 3, barrier="once")
    assert len(secs) == 2 and all(s > 0 for s in secs)
    assert slowest([1.0, 2.0]) == [1.0, 2.0]
    cycles = _busy_cycles()
    y = torch.ones(1024, device="cuda")

    def behind_work():  # an asynchronous NCCL all-reduce queued after BUSY_S of GPU work
        torch.cuda._sleep(cycles)
        return dist.all_reduce(y, async_op=True)

    assert min(time_calls(behind_work, 3, barrier="once", device="cuda")) >= 0.9 * BUSY_S
    points = measure_allreduce(
        lambda t: dist.all_reduce(t, async_op=True), torch.zeros(1 << 16, device="cuda"), None
    )
    assert len(points) == 5 and all(t > 0 for _, t in points)


class _Spin(torch.nn.Module):
    """No parameters: spins the GPU for BUSY_S (a layer whose kernels take that long)."""

    def __init__(self, cycles: int):
        super().__init__()
        self.cycles = cycles

    def forward(self, x):
        torch.cuda._sleep(self.cycles)
        return x


@pytest.mark.cuda
def test_the_runtime_profiles_device_times_on_the_gpu():
    from dpcomm.train.online import DataParallel

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(4, 4), _Spin(_busy_cycles()), torch.nn.Linear(4, 1)
        ).cuda()
        dp = DataParallel(model, plan="mgwfbp", profile_iters=1, verify_iters=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.ones(2, 4, device="cuda")
        for _ in range(2):
            dp(x).sum().backward()
            dp.step(opt)
        dp.close()
    finally:
        dist.destroy_process_group()
    f = [layer.forward_s for layer in dp.trace.layers]
    assert f[0] >= 0.9 * BUSY_S > f[1], f
    assert all(r.total_s >= 0.9 * BUSY_S for r in dp.records), dp.records


@pytest.mark.cuda
@pytest.mark.slow
def test_gpu_check_small_passes_on_the_gpu(tmp_path):
    # the prepared script at tiny sizes: NCCL at 1 rank, gloo on CUDA tensors for 2 ranks, every case
    out = tmp_path / "check.json"
    run = subprocess.run([sys.executable, str(CHECK), "--small", "--ranks", "2", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["mode"] == "gpu" and "gpu" in r["machine"] and all(c["ok"] for c in r["cases"])


# ------------------------------------------------------------------------- the script on the CPU


EXPECTED = ["profile", "timing", "collectives", "ddp", "wrap", "shard", "runtime", "ps"]


def test_gpu_check_dry_run_runs_every_case_on_the_cpu(tmp_path):
    out = tmp_path / "dry.json"
    assert _gpu_check().main(["--dry-run", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["mode"] == "dry-run" and r["ranks"] == 1 and "gpu" not in r["machine"]
    assert [c["case"].split("-")[0] for c in r["cases"]] == EXPECTED
    assert all(c["ok"] and c["checks"] for c in r["cases"]), [c for c in r["cases"] if not c["ok"]]
    wrap = next(c for c in r["cases"] if c["case"] == "wrap-gloo")
    assert wrap["buckets"] and sorted(wrap["buckets"]) == sorted(wrap["plan"])
    coll = next(c for c in r["cases"] if c["case"] == "collectives-gloo")
    assert [row["bytes"] for row in coll["allreduce"]["rows"]] == [4096, 65536]


def test_gpu_check_refuses_bad_requests_in_one_line(capsys):
    check = _gpu_check()
    assert check.main(["--dry-run", "--ranks", "5"]) == 2
    assert capsys.readouterr().err.strip() == "gpu_check: error: --ranks must be 1-4"
    if not torch.cuda.is_available():
        assert check.main([]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("gpu_check: error: no CUDA device") and "\n" not in err


@pytest.mark.slow
def test_gpu_check_launch_on_the_cpu(tmp_path):
    # the launch the GPU run makes, on CPU tensors: 2 gloo ranks, rank 0's group of one, merged records
    out = tmp_path / "cpu.json"
    run = subprocess.run([sys.executable, str(CHECK), "--cpu", "--ranks", "2", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    r = json.loads(out.read_text())
    names = [c["case"] for c in r["cases"]]
    assert names == ["profile"] + [f"{n}-gloo" for n in EXPECTED[1:]] + [
        f"{n}-nccl1" for n in ("timing", "collectives", "ddp", "wrap", "shard")
    ]
    assert all(c["ok"] for c in r["cases"]), [c for c in r["cases"] if not c["ok"]]
    coll = next(c for c in r["cases"] if c["case"] == "collectives-gloo")
    assert coll["world"] == 2 and coll["allreduce"]["rows"][0]["busbw_GBps"] > 0
    runtime = next(c for c in r["cases"] if c["case"] == "runtime-gloo")
    assert "STEADY" in runtime["mgwfbp"]["phases"] and "TRIAL" in runtime["mgwfbp"]["phases"]
