"""Worker function for tests/test_ddp_hooks.py (module level: the launcher spawns workers that import it).

``hook_cases`` checks dpcomm collectives as DDP comm hooks against DDP's own all-reduce on integer-valued
gradients, on 4 workers: first on the whole world (the default group), then on two groups of 2 at once
(ranks 0-1 and 2-3: the hook state and DDP get the group), so one launch covers both group sizes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpcomm.launch import init_worker

MODES = ("inline", "thread", "fp16")


def _int_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 5), nn.ReLU(), nn.Linear(5, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randint(-3, 4, p.shape).float())
    return model


def _cases(names: list[str], x: torch.Tensor, group: Any) -> dict[str, Any]:
    """Per collective and state kind on ``group`` (None: the default group): max |grad(DDP + dpcomm hook) -
    grad(DDP)| over all parameters, the largest gradient, and how many buckets the hook was handed."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_wrapper

    from dpcomm.ddp import HookState, collective_hook, wrap

    def grads(ddp: nn.Module) -> list[torch.Tensor]:
        for _ in range(2):  # the second iteration runs the rebuilt buckets
            for p in ddp.parameters():
                p.grad = None
            ddp(x).sum().backward()
        return [p.grad.clone() for p in ddp.parameters()]

    planned = wrap(_int_model(0), "wfbp", example=x, process_group=group)  # profiled and planned once
    reference = grads(planned)
    plan = planned.dpcomm.plan  # the same buckets for every hooked DDP below, without planning each again
    out: dict[str, Any] = {"plan": [list(g) for g in plan.groups]}
    for name in names:
        for mode in MODES:
            ddp = wrap(_int_model(0), plan, example=x, process_group=group)
            inner, calls = collective_hook(name), [0]

            def hook(state, bucket, inner=inner, calls=calls):  # counts the buckets DDP hands over
                calls[0] += 1
                return inner(state, bucket)

            # inline: the hook state is the group (None: the default one); thread: a HookState over it
            state: Any = HookState(process_group=group) if mode == "thread" else group
            ddp.register_comm_hook(state, fp16_compress_wrapper(hook) if mode == "fp16" else hook)
            try:
                got = grads(ddp)
                diff = max(float((a - b).abs().max()) for a, b in zip(got, reference, strict=True))
                scale = max(float(g.abs().max()) for g in got)
                out[f"{name}/{mode}"] = {"diff": diff, "scale": scale, "calls": calls[0]}
            except Exception as exc:  # noqa: BLE001 - reported to the test
                out[f"{name}/{mode}"] = {"error": f"{type(exc).__name__}: {exc}"}
            if isinstance(state, HookState):
                state.close()
    return out


def hook_cases(algos: dict[int, list[str]]) -> dict[int, dict[str, Any]]:
    """``{group size: collectives}`` -> ``{group size: this rank's results}``; sizes 4 (the world) and 2."""
    rank, world = init_worker()
    torch.set_num_threads(1)
    assert world == 4 and set(algos) == {2, 4}
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes every group
    torch.manual_seed(100 + rank)
    x = torch.randint(-2, 3, (4, 6)).float()
    out = {4: _cases(algos[4], x, None)}
    out[2] = _cases(algos[2], x, pairs[rank // 2])
    out[2]["group"] = [dist.get_rank(pairs[rank // 2]), dist.get_world_size(pairs[rank // 2])]
    return out
