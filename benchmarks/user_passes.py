"""How many forward calls and backward passes ``dpcomm.ddp.wrap`` and ``dpcomm.fsdp.shard`` run on the user's
module before they return (docs/ddp.md, "How often wrap runs the model"; docs/fsdp.md).

A two-layer model counts its own ``forward`` calls and, by a hook on its output, the backward passes through
it; each door is called once per planner on one gloo rank (``python benchmarks/user_passes.py``). The counts
do not depend on the machine; the trial's count grows with the candidates it times (more on more ranks).
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
from torch import nn


class Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)
        self.fwd = self.bwd = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fwd += 1
        y = self.b(torch.relu(self.a(x)))
        if y.requires_grad:
            y.register_hook(lambda g: setattr(self, "bwd", self.bwd + 1))
        return y


def main() -> None:
    import dpcomm.ddp
    import dpcomm.fsdp
    from dpcomm.plan import Plan

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    x = torch.randn(4, 8)
    runs = [
        ("wrap", "wfbp", {"example": x}),
        ("wrap", "mgwfbp", {"example": x}),
        ("wrap", "optimal", {"example": x}),
        ("wrap", "optimal", {"example": x, "verify_iters": 0}),
        ("wrap", Plan.from_sizes("given", [2], 2), {"example": x}),
        ("wrap", "wfbp", {}),
        ("shard", "optimal", {"example": x}),
        ("shard", "per-block", {"example": x}),
        ("shard", "per-block", {}),
    ]
    print("door   planner     options                      forward  backward")
    for door, plan, kw in runs:
        torch.manual_seed(0)
        m = Counting()
        (dpcomm.ddp.wrap if door == "wrap" else dpcomm.fsdp.shard)(m, plan, **kw)
        name = plan if isinstance(plan, str) else "a Plan"
        opts = ", ".join(k if k == "example" else f"{k}={v}" for k, v in kw.items()) or "-"
        print(f"{door:<6} {name:<11} {opts:<28} {m.fwd:>7}  {m.bwd:>8}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
