"""A torchrun-style script that calls ``dpcomm.fsdp.shard`` ends with exit status 0 (issue 46, finding 3).

The script is what a user writes: the model at module level, ``shard(model, "optimal", example=x)``, three
SGD steps, ``destroy_process_group()``, then the interpreter's own exit, where jobs used to end in
"terminate called without an active exception" (SIGABRT, about one run in eight): the trial's sharded
copies (FSDP2 states in reference cycles) outlived ``shard`` and were torn down with the interpreter. Ten
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
from tests._corpus import CORPUS, loss_of
import dpcomm.fsdp

dist.init_process_group("gloo")
build, batch_of, _ = CORPUS["nested"]
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


@pytest.mark.slow
def test_a_shard_script_exits_cleanly_ten_times(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "helper.py").write_text(HELPER)
    root = str(Path(__file__).resolve().parents[1])
    ports = json.dumps(_free_ports(RUNS))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    helpers = [
        subprocess.Popen(
            [sys.executable, str(tmp_path / "helper.py"), root, str(r), str(tmp_path / "train.py"), ports],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for r in range(2)
    ]  # fmt: skip
    codes = []
    for h in helpers:
        out, err = h.communicate(timeout=400)
        assert h.returncode == 0, err[-600:]
        codes.append(json.loads(out.strip().splitlines()[-1]))
    assert codes == [[0] * RUNS] * 2, f"exit codes per rank (-6: SIGABRT): {codes}"
