"""A torchrun-style script that calls ``dpcomm.fsdp.shard`` ends with exit status 0 (issue 46, finding 3),
after refusals too (issue 54, finding 5).

The script is what a user writes: three calls ``shard`` refuses in one line (caught), the model at module
level, ``shard(model, "optimal", example=x)``, three SGD steps, ``destroy_process_group()``, then the
interpreter's own exit, where jobs used to end in "terminate called without an active exception" (SIGABRT,
about one run in eight): the trial's sharded copies (FSDP2 states in reference cycles) outlived ``shard``,
and what a refused ``shard`` had built outlived the refusal, both torn down with the interpreter. Ten
runs of two ranks, each rank a child forked from a helper that imported torch once (the cheapest start that
still exits through the interpreter's teardown; ``OMP_NUM_THREADS=1``: no thread pool to fork); every child
must exit 0. The symptom is a chance event, so this test can pass on a faulty build; that no copy outlives
``shard`` is checked deterministically on every corpus case (``tests/test_user_models.py``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

RUNS = 10

SCRIPT = """
import torch
import torch.distributed as dist
from torch import nn
from tests._corpus import CORPUS, loss_of
import dpcomm.fsdp
from dpcomm.errors import UserError

dist.init_process_group("gloo")
build, batch_of, _ = CORPUS["encoder"]
torch.manual_seed(0)
x = batch_of(10 + dist.get_rank())[0]
mixed = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 4))
mixed[0].bfloat16(), mixed[2].bfloat16()
refusals = [  # a budget no plan meets, sparse gradients, parameters of mixed dtypes
    lambda: dpcomm.fsdp.shard(build(), "optimal", example=x, memory=64, profile_iters=1),
    lambda: dpcomm.fsdp.shard(nn.Sequential(nn.Embedding(32, 16, sparse=True), nn.Linear(16, 4)),
                              "optimal", example=x),
    lambda: dpcomm.fsdp.shard(mixed, "optimal", example=torch.randn(6, 16, dtype=torch.bfloat16),
                              loss_fn=lambda out: out.float().pow(2).mean(), profile_iters=1),
]
for refuse in refusals:
    try:
        refuse()
        raise SystemExit(3)  # not refused: a test failure, not a clean exit
    except UserError:
        pass
build, batch_of, _ = CORPUS["nested"]  # then a shard that is not refused, trained
torch.manual_seed(0)
model = build()
x, y = batch_of(10 + dist.get_rank())
model = dpcomm.fsdp.shard(model, "optimal", example=x, profile_iters=1, verify_iters=1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    loss_of(model(x), y).backward()
    opt.step()
dist.destroy_process_group()
"""


HELPER = """
import json, os, runpy, sys
sys.path.insert(0, sys.argv[1])
import torch, torch.distributed, dpcomm.fsdp, tests._corpus  # imported once, before the forks
import torch._dynamo, torch.distributed.fsdp, torch.distributed.checkpoint.state_dict  # what shard imports
import dpcomm.fsdp.costs, dpcomm.planner.fsdp, dpcomm.trace.profiler  # on its first call (~3 s a run)
rank, script, ports = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
codes = []
for port in ports:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=rank)
    pid = os.fork()
    if pid == 0:
        runpy.run_path(script, run_name="__main__")
        sys.exit(0)  # unwinds to this script's top: the interpreter's own teardown, as after torchrun
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print(json.dumps(codes))
"""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _ten_runs(tmp_path: Path, script: str) -> list[list[int]]:
    """Each rank's exit codes over :data:`RUNS` runs of ``script`` (two ranks a run), two runs at a time
    (a pair of helpers per half of the runs: a run waits on its rendezvous and collectives much of the
    time, so two share the 2 cores)."""
    (tmp_path / "train.py").write_text(script)
    (tmp_path / "helper.py").write_text(HELPER)
    root = str(Path(__file__).resolve().parents[1])
    ports = _free_ports(RUNS)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    halves = [ports[: RUNS // 2], ports[RUNS // 2 :]]
    helpers = [
        subprocess.Popen(
            [sys.executable, str(tmp_path / "helper.py"), root, str(r), str(tmp_path / "train.py"),
             json.dumps(half)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for r in range(2) for half in halves
    ]  # fmt: skip
    codes: list[list[int]] = [[], []]
    for k, h in enumerate(helpers):
        out, err = h.communicate(timeout=400)
        assert h.returncode == 0, err[-600:]
        codes[k // 2] += json.loads(out.strip().splitlines()[-1])
    return codes


@pytest.mark.slow
def test_a_shard_script_exits_cleanly_ten_times(tmp_path: Path) -> None:
    """Three refusals a run (a budget, sparse gradients, mixed dtypes), each one line the script catches,
    then a ``shard`` that is not refused and three steps, ``destroy_process_group()`` and the interpreter's
    exit: neither what ``shard`` built before refusing (``dpcomm.utils.user_run.nothing_left``) nor the
    trial's copies outlive it, so every run exits 0 (3: a refusal did not come)."""
    codes = _ten_runs(tmp_path, SCRIPT)
    assert codes == [[0] * RUNS] * 2, f"exit codes per rank (-6: SIGABRT, 3: not refused): {codes}"
