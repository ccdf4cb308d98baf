"""Worker functions for tests/test_ps.py (module level: the launcher spawns processes that import them).

One launch of ``W + S`` processes (:func:`run_all`) runs every case back to back: co-located cases on the
group of the first ``W`` ranks (the others sit them out), dedicated ones on all ranks; then the one-off
checks, each on the first ranks it needs and process groups of its own (one launch instead of five: a
process start, torch's import and the first optimizer's ``torch._dynamo`` import cost more than any check).
"""

from __future__ import annotations

import copy
import functools
import os
import time
from typing import Any

import torch
import torch.distributed as dist

from dpcomm.launch import init_worker
from dpcomm.models import get_model, input_shape
from dpcomm.ps.layout import Layout
from dpcomm.ps.rank import PsRank
from dpcomm.ps.server import PsServer
from dpcomm.ps.spec import PsSpec
from dpcomm.ps.worker import PsWorker
from dpcomm.runtime.data import TrainData, derive_seed
from dpcomm.train.setup import params_sha256
from dpcomm.utils.groups import group_timeout

LR, MOMENTUM, WD = 0.05, 0.9, 1e-4


def _build(seed: int = 0):
    torch.manual_seed(seed)
    model = get_model("lenet5", 10)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    return model, opt


@functools.cache  # batches are a function of (seed, epoch, iteration): one parse of the digits per rank
def _data(rank: int, workers: int, batch: int) -> TrainData:
    return TrainData(
        "digits",
        input_shape=input_shape("lenet5"),
        num_classes=10,
        batch_size=batch,
        world_size=workers,
        rank=rank,
        seed=0,
    )


def _run(spec, rank, workers, iters, batch, group, lanes, start=0, state=None, ckpt_at=lambda _t: False):
    model, opt = _build()
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    data = _data(rank, workers, batch) if rank < workers else None
    sample = data.batch(start)[0] if data is not None else None
    ps = PsRank(
        model,
        opt,
        spec,
        rank=rank,
        workers=workers,
        start=start,
        sample=sample,
        group=group,
        ckpt_at=ckpt_at,
        stop=iters,
        resumed=(state or {}).get("replica"),
        lanes=lanes,
    )
    saved = None
    for it in range(start, iters):
        x, y = data.batch(it) if data is not None else (None, None)
        torch.manual_seed(derive_seed(0, rank, it))
        ps.iteration(x, y)
        if rank == 0 and ckpt_at(it):
            saved = {
                "model": copy.deepcopy(model.state_dict()),
                "optimizer": copy.deepcopy(opt.state_dict()),
                "replica": copy.deepcopy(ps.checkpoint_state()),
            }
    ps.finish()
    ps.close()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    # request mode notes when each forward's last batch came in; the first iteration pulls nothing
    asked = [r["pulls_in_unix"] is not None for r in ps.records[1:]]
    planned = {"time_s": ps.pull_plan.time_s, **ps.pull_plan.meta}  # rank 0's inputs and the fitted d
    order = [(r["pulls_posted_unix"], r["pulls_sending_unix"], r["pulls_sent_unix"]) for r in ps.records]
    return flat, params_sha256(model), saved, ps.pull_plan.to_dict(), asked, planned, order


def run_cases(cases: list[dict[str, Any]], workers: int, servers: int) -> list[dict[str, Any]]:
    rank, _world = init_worker("gloo", timeout_s=30)
    torch.set_num_threads(1)
    colocated = dist.new_group(list(range(workers)))
    # the push/pull lanes of both rank sets, made once on every rank (the co-located cases leave some out)
    timeout = group_timeout()  # the run's 30 s, not new_group's default of 30 minutes
    lanes = {True: tuple(dist.new_group(list(range(workers)), timeout=timeout) for _ in range(3))}
    lanes[False] = tuple(dist.new_group(timeout=timeout) for _ in range(3))
    out = []
    for case in cases:
        spec = PsSpec(**case["spec"], probe_rounds=1)
        group = colocated if not spec.servers else None
        if not spec.servers and rank >= workers:
            out.append(None)
            dist.barrier()
            continue
        run = functools.partial(
            _run, spec, rank, workers, case["iters"], case["batch"], group, lanes[not spec.servers]
        )
        ckpt_at = lambda t, c=case: t == c.get("ckpt", -1)  # noqa: E731
        flat, sha, saved, plan, asked, planned, order = run(ckpt_at=ckpt_at)
        row = {"sha": sha, "flat": flat if rank < workers else None, "plan": plan, "asked": asked}
        row["planned"], row["order"] = planned, order
        if "ckpt" in case:  # resume from the state saved after iteration ckpt, on every rank
            box = [saved]
            dist.broadcast_object_list(box, src=0, group=group)
            flat2, sha2, *_ = run(start=case["ckpt"] + 1, state=box[0])
            row["resumed_sha"] = sha2
        out.append(row)
        dist.barrier()
    return out


def run_all(
    cases: list[dict[str, Any]], workers: int, servers: int, methods: list[str], iters: int, batch: int
) -> dict[str, Any]:
    """:func:`run_cases`, then on the first ranks :func:`request_order` (2), :func:`push_after_pulls` (3),
    :func:`user_gpt` (2) and :func:`googlenet_layers` (1), each on process groups of its own over those
    ranks (the roles by rank as in a launch of that many), and on the last worker the all-reduce
    :func:`reference` of ``iters`` iterations; this rank's results by name."""
    rank, _world = init_worker("gloo", timeout_s=30)
    timeout = group_timeout()  # the run's 30 s, not new_group's default of 30 minutes

    def lanes(members: list[int]) -> tuple[Any, ...]:
        return tuple(dist.new_group(members, timeout=timeout) for _ in range(3))

    # every group now, on every rank and in one order (new_group is a call of the whole default group)
    pair, trio, gpt, solo = lanes([0, 1]), lanes([0, 1, 2]), lanes([0, 1]), lanes([0])
    gpt_group, solo_group = dist.new_group([0, 1], timeout=timeout), dist.new_group([0], timeout=timeout)
    out: dict[str, Any] = {"cases": run_cases(cases, workers, servers)}  # ends in a barrier of every rank
    # a check that raises fails its own test, not the launch (its partners' waits end in the 30 s timeout)
    if rank < 2:
        out["request_order"] = _caught(request_order, pair)
    if rank < 3:
        out["push_after_pulls"] = _caught(push_after_pulls, trio)
    if rank == workers - 1:  # a worker (its digits are loaded) that is done with the checks
        out["reference"] = reference(iters, workers, batch)
    if rank < 2:
        out["user_gpt"] = _caught(user_gpt, methods, gpt_group, gpt)
    if rank == 0:  # last: nobody waits for it; the other ranks are done, so it may have every core
        torch.set_num_threads(os.cpu_count() or 1)
        out["googlenet"] = _caught(googlenet_layers, solo_group, solo)
    return out


def _caught(fn: Any, *args: Any) -> dict[str, Any]:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - handed to the check's test
        return {"error": f"{type(exc).__name__}: {exc}"}


def reference(iters: int, workers: int, batch: int) -> torch.Tensor:
    """All-reduce S-SGD in one process: every worker's batch with its own dropout seed, gradients averaged
    (what ``--schedule single`` computes, up to the order of the float sums)."""
    model, opt = _build()
    data = [_data(r, workers, batch) for r in range(workers)]
    for it in range(iters):
        grads = [torch.zeros_like(p) for p in model.parameters()]
        for r in range(workers):
            x, y = data[r].batch(it)
            torch.manual_seed(derive_seed(0, r, it))  # the same dropout masks as worker r
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            for g, p in zip(grads, model.parameters(), strict=True):
                g += p.grad
        for g, p in zip(grads, model.parameters(), strict=True):
            p.grad = g / workers
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def googlenet_layers(group: Any, lanes: tuple[Any, ...]) -> dict[str, Any]:
    """One rank's PS set-up and one iteration on GoogLeNet (64x64 inputs): its layer order and the loss.
    ``group`` and ``lanes``: process groups of this rank alone."""
    from dpcomm.models import learnable_layers

    torch.manual_seed(0)
    model = get_model("googlenet", 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(2, 3, 64, 64), torch.tensor([1, 2])
    spec = PsSpec(pull="ibatch", probe_rounds=1)
    ps = PsRank(model, opt, spec, rank=0, workers=1, sample=x, stop=1, group=group, lanes=lanes)
    names = {id(m): n for n, m in model.named_modules()}
    loss = ps.iteration(x, y)
    ps.finish()
    return {
        "ps": [names[id(m)] for m in ps.layers],
        "forward": [n for n, _ in learnable_layers(model, x)],
        "registered": [n for n, _ in learnable_layers(model)],
        "loss": loss,
        "C": ps.pull_plan.meta["C_s"],
    }


def request_order(lanes: tuple[Any, ...]) -> dict[str, Any]:
    """Rank 0 a worker, rank 1 a dedicated server of three one-tensor layers: three pulls in request mode,
    then three in send mode (tags apart); the worker's tickets say when each unit was asked for and in.
    ``lanes``: process groups of ranks 0 and 1."""
    rank = dist.get_rank()
    layout = Layout(
        workers=1, servers=1, colocated=False, numels=(1000,) * 3, layer_params=((0,), (1,), (2,))
    )
    units = [(0, 0), (1, 1), (2, 2)]
    modes = (("request", 500000), ("send", 600000))
    if rank == 1:
        params = [torch.full((1000,), float(i + 1)) for i in range(3)]
        server = PsServer(layout, 0, params, [(0, 2)], lr=0.1, momentum=0.0, group=lanes)
        for mode, tag in modes:
            (server.answer if mode == "request" else server.send)(units, tag)
            server.finish()
        return {}
    out: dict[str, Any] = {}
    for mode, tag in modes:
        params = [torch.zeros(1000) for _ in range(3)]
        worker = PsWorker(layout, 0, params, group=lanes)
        tickets = (worker.request if mode == "request" else worker.pull)(units, tag)
        for t in tickets:
            worker.wait(t)
        out[mode] = {"params": params, "times": [(t.asked_s, t.arrived_s) for t in tickets]}
    return out


def push_after_pulls(lanes: tuple[Any, ...]) -> dict[str, Any]:
    """Ranks 0 and 1 workers, rank 2 a dedicated server, request mode, two iterations. Worker 1 asks for
    its first pull a second late; worker 0 pulls at once and pushes again. Each says when (``time.time()``)
    its second push was taken (worker 0) or it woke to ask (worker 1). ``lanes``: process groups of ranks
    0-2."""
    rank = dist.get_rank()
    layout = Layout(
        workers=2, servers=1, colocated=False, numels=(1000,) * 3, layer_params=((0,), (1,), (2,))
    )
    units, pushes = [(0, 0), (1, 1), (2, 2)], [(0, 2)]
    if rank == 2:
        server = PsServer(
            layout, 0, [torch.zeros(1000) for _ in range(3)], pushes, lr=0.1, momentum=0.0, group=lanes
        )
        server.post_pushes()
        server.serve(units, request=True)
        server.serve(units, request=True, post_next=False)
        server.finish()
        return {}
    params = [torch.zeros(1000) for _ in range(3)]
    for p in params:
        p.grad = torch.ones(1000)
    worker = PsWorker(layout, rank, params, group=lanes)
    out: dict[str, Any] = {}
    for it in range(2):
        worker.push(0, pushes[0])
        worker.finish_pushes()
        out.setdefault("pushed", []).append(time.time())
        if it == 0 and rank == 1:
            time.sleep(1.0)
            out["woke"] = time.time()
        for t in worker.request(units):
            worker.wait(t)
    out["params"] = params
    return out


def user_gpt(methods: list[str], group: Any, lanes: tuple[Any, ...]) -> dict[str, Any]:
    """A user's small GPT (tests/_ddp_workers.HandGPT: a tied embedding, a frozen LayerNorm, an unused
    head, nn.MultiheadAttention whose out_proj weight the attention applies inline) trained 4 iterations by
    the co-located parameter server with each pull method; this rank's parameter hash and loss per method.
    ``group`` and ``lanes``: process groups of the ranks that train (ranks 0 and 1)."""
    from tests._ddp_workers import HandGPT

    rank, world = dist.get_rank(), dist.get_world_size(group)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 32, (4, 8), generator=g), torch.randint(0, 32, (4, 8), generator=g)
    out = {}
    for method in methods:
        torch.manual_seed(0)
        model = HandGPT()
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
        spec = PsSpec(pull=method, probe_rounds=1)
        ps = PsRank(model, opt, spec, rank=rank, workers=world, sample=x, stop=4, group=group, lanes=lanes)
        losses = [ps.iteration(x, y) for _ in range(4)]
        ps.finish()
        ps.close()
        out[method] = {"sha": params_sha256(model), "losses": losses, "plan": list(ps.pull_plan.batches)}
    return out
