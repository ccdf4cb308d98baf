"""A torchrun-style script that calls ``dpcomm.fsdp.shard`` ends with exit status 0 (issue 46, finding 3).

The script is what a user writes: the model at module level, ``shard(model, "optimal", example=x)``, three
SGD steps, ``destroy_process_group()``, and the interpreter's own exit. Two ranks are started as plain
processes (``env://``, no launcher: the cheapest start) ten times; every process must exit 0. Before the fix
the trial's sharded copies (FSDP2 states in reference cycles) outlived ``shard`` and were torn down with the
interpreter, and about one run in eight ended in "terminate called without an active exception" (SIGABRT).
That no copy outlives ``shard`` is checked deterministically on every corpus case
(``tests/test_user_models.py``); this test is the symptom's, so it can pass on a faulty build by chance.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

RUNS = 10

SCRIPT = """
import sys
import torch
import torch.distributed as dist
sys.path.insert(0, {root!r})
from tests._corpus import CORPUS, loss_of
import dpcomm.fsdp

dist.init_process_group("gloo")
torch.set_num_threads(1)
build, batch_of, _ = CORPUS["encoder"]
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_shard_script_exits_cleanly_ten_times(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(root=str(Path(__file__).resolve().parents[1])))
    codes = []
    for _ in range(RUNS):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2"}
        procs = [
            subprocess.Popen(
                [sys.executable, str(script)], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )
            for r in range(2)
        ]  # fmt: skip
        for p in procs:
            _, err = p.communicate(timeout=120)
            codes.append(p.returncode)
            assert p.returncode == 0, f"exit {p.returncode} after {len(codes)} processes: {err[-400:]}"
    assert codes == [0] * 2 * RUNS
