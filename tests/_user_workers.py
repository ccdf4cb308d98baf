"""Worker functions for tests/test_user_models.py: the corpus of :mod:`tests._corpus` through
``dpcomm.ddp.wrap`` and ``dpcomm.fsdp.shard``, each trained next to plain PyTorch from the same weights and
the same random state (module level: the launcher spawns workers that import them).

Per case a worker reports plain data: the losses of both, the largest gradient and parameter differences,
whether the random state after ``wrap``/``shard`` is the one before, whether the replicas agree (a
fingerprint gathered from every rank), the buckets DDP really ran (a recording comm hook registered after
training, read as unit indices) beside the plan, and what was said (warnings, ``str(...dpcomm)``).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import traceback
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dpcomm.launch import init_worker
from dpcomm.utils.user_run import call
from tests._corpus import CORPUS, ZOO, loss_of

STEPS = 3
LR = 0.1


def _start() -> int:
    """Join the group, one thread; then everything alive so far (torch and its imports: some 300,000
    objects) is moved out of the collector's sight (``gc.freeze``): the ``gc.collect`` that ``wrap``'s
    trial and ``shard`` run, and the scan for lingering FSDP2 modules, see only what the cases made since
    (each full pass over the imports cost about 0.3 s, several per case)."""
    rank, _ = init_worker()
    torch.set_num_threads(1)
    gc.collect()
    gc.freeze()
    return rank


def _rng() -> torch.Tensor:
    return torch.get_rng_state()


def _fingerprint(model: nn.Module) -> list[float]:
    """Every rank's parameters, summarised: replicas agree when these agree bitwise."""
    out = []
    for _, p in sorted(model.named_parameters()):
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out += [float(t.detach().double().sum()), float(t.detach().double().abs().sum())]
    return out


def _same_on_all_ranks(values: Any) -> bool:
    got: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(got, values)
    return all(g == got[0] for g in got)


def _train(model: nn.Module, batch: Any, extra: str | None) -> tuple[list[float], dict[str, torch.Tensor]]:
    """``STEPS`` SGD steps on this rank's batch; the losses and the last step's gradients by name.
    ``extra="momentum"``: SGD with momentum 0.9, and token batches shifted each step (a router sends them
    to other experts: some expert goes unused on every rank in some step)."""
    x, y = batch
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9 if extra == "momentum" else 0.0)
    if extra == "accum":  # param groups: the later half of the parameters slower, with momentum
        ps = list(model.parameters())
        half = len(ps) // 2
        opt = torch.optim.SGD(
            [{"params": ps[:half]}, {"params": ps[half:], "lr": LR / 2, "momentum": 0.9}], lr=LR
        )
    losses = []
    grads: dict[str, torch.Tensor] = {}
    batch0 = x
    for step in range(STEPS):
        if extra == "momentum" and not x.is_floating_point():  # a fresh batch each step: tokens shifted
            x = (batch0 + 5 * step) % (int(batch0.max()) + 1)
        opt.zero_grad(set_to_none=True)
        if extra in ("no_sync", "accum"):  # gradient accumulation over two halves, DDP's way
            h = x.shape[0] // 2
            with model.no_sync():
                loss_of(model(x[:h]), y[:h]).backward()
            loss = loss_of(model(x[h:]), y[h:])
            loss.backward()
        elif extra == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_of(call(model, x), y)
            loss.backward()
        else:
            loss = loss_of(call(model, x), y)
            loss.backward()
        grads = {
            n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
            for n, p in model.named_parameters()
            if p.grad is not None
        }
        opt.step()
        losses.append(float(loss.detach()))
    return losses, grads


HOOKED = ("hook", "accum")
"""Extras with a user's comm hook (DDP takes one: the recording hook cannot be added after)."""


def _user_hook(model: DistributedDataParallel, extra: str | None) -> None:
    """The comm hook a user registers after ``wrap`` (and on plain DDP): PyTorch's ``allreduce_hook``, or
    for ``accum`` the user's own (:func:`_sum_then_mean`)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if extra == "hook":
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    elif extra == "accum":
        model.register_comm_hook(None, _sum_then_mean)


def _sum_then_mean(state, bucket):  # no annotations: DDP compares them with the classes, not with strings
    """A user's hook: all-reduce the sum, then divide (DDP divides first)."""
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(dist.get_world_size()))


def _diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if set(a) != set(b):
        return float("inf")
    return max((float((a[n] - b[n]).abs().max()) for n in a), default=0.0)


def _none_as_zero(grads: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """DDP's gradients by name, zeros where DDP left ``None`` and ``grads`` holds zeros: FSDP2 reduce-scatters
    zeros for the parameters no rank used in a group some rank left without a gradient."""
    out = {k.removeprefix("module."): v for k, v in ref.items()}
    return out | {n: g for n, g in grads.items() if n not in out and not g.any()}


def _strip(name: str) -> str:
    """A parameter's name in the user's model: without DDP's ``module.`` (and a compiled DDP's
    ``_orig_mod.``)."""
    return name.removeprefix("_orig_mod.").removeprefix("module.")


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        _strip(n): (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
        for n, p in model.named_parameters()
    }


def _recorded_buckets(
    ddp: DistributedDataParallel,
    batch: Any,
    unit_of: dict[int, int],
    *,
    dtypes: bool = False,
    loss: Any = None,
) -> list[Any]:
    """The buckets DDP runs, as sorted unit indices per bucket in communication order (``dtypes``: as
    ``[sorted unit indices, dtype]``), read in one iteration through a recording comm hook that all-reduces
    as DDP does."""
    log: list[Any] = []

    def hook(state, bucket):  # no annotations: DDP compares them with the classes, not with strings
        units = sorted({unit_of[id(p)] for p in bucket.parameters()})
        log.append([units, str(bucket.buffer().dtype)] if dtypes else units)
        t = bucket.buffer().div_(dist.get_world_size())
        return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])

    ddp.register_comm_hook(None, hook)
    x, y = batch
    (loss or loss_of)(call(ddp, x), y).backward()
    return log


@contextlib.contextmanager
def _counting_ddps(seen: list[int]) -> Any:
    """Every DDP ``wrap`` builds (its trial's candidates, then the user's) appends to ``seen`` how many
    DDPs it built before were still alive (plain torch cannot run several around one module with unused
    parameters: issue 54, finding 1)."""
    import importlib
    import weakref

    modules = [importlib.import_module(m) for m in ("dpcomm.ddp.wrap", "dpcomm.ddp.trial")]  # the modules:
    real, built = modules[0].build_ddp, []  # dpcomm.ddp.wrap is also the function

    def build(*args: Any, **kwargs: Any) -> Any:
        seen.append(sum(r() is not None for r in built))
        ddp = real(*args, **kwargs)
        built.append(weakref.ref(ddp))
        return ddp

    for module in modules:
        module.build_ddp = build
    try:
        yield
    finally:
        for module in modules:
            module.build_ddp = real


@contextlib.contextmanager
def _three_candidates(on: Any) -> Any:
    """``wrap``'s trial times three candidates or more, the planned plan, ``single``, ``wfbp`` (a bucket per
    unit) and ``bucket:16KB``, whatever DDP's default buckets are (on a model under 1 MiB they are
    ``single``'s one bucket; the trial times each distinct plan once)."""
    if not on:
        yield
        return
    from dpcomm.planner import autoplan, make_plan

    real = autoplan.candidates
    autoplan.candidates = lambda plan, trace, cost, nodes: [plan] + [
        make_plan(s, trace, cost, nodes) for s in ("single", "wfbp", "bucket:16KB")
    ]  # fmt: skip
    try:
        yield
    finally:
        autoplan.candidates = real


def wrap_cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case ``{model, planner, ddp: kwargs, extra}``: ``wrap`` against plain DDP with the same buckets."""
    from dpcomm.ddp import wrap

    rank = _start()
    out = []
    for case in cases:
        build, batch_of, _ = CORPUS[case["model"]]
        torch.manual_seed(0)  # the same initial model on every rank
        model = build()
        plain = copy.deepcopy(model)
        batch = batch_of(10 + rank)  # each rank its own batch: the averaged gradient matters
        kwargs = dict(case.get("ddp", {}))
        torch.manual_seed(100 + rank)
        before = _rng()
        r: dict[str, Any] = {}
        try:
            alive: list[int] = []
            with (
                warnings.catch_warnings(record=True) as caught,
                _three_candidates(case.get("candidates")),
                _counting_ddps(alive),
            ):
                warnings.simplefilter("always")
                ddp = wrap(
                    model, case["planner"], example=batch[0], loss_fn=None, profile_iters=1,
                    verify_iters=case.get("verify_iters", 1), **kwargs,
                )  # fmt: skip
            r["rng_same"] = bool(torch.equal(before, _rng()))
            r["ddps_alive"], r["ddps_built"] = max(alive, default=0), len(alive)
            r["warnings"] = [str(m.message) for m in caught if "dpcomm" in str(m.message)]
            w = ddp.dpcomm
            r["text"] = str(w)
            caps = w.caps
            if case.get("extra") == "compile":  # compiled after wrap, as PyTorch's DDP tutorial does
                ddp = torch.compile(ddp, backend="eager")
            _user_hook(ddp, case.get("extra"))  # a user's comm hook, registered after wrap
            losses, grads = _train(ddp, batch, case.get("extra"))
            torch.set_rng_state(before)
            ref = DistributedDataParallel(plain, **caps.ddp_kwargs(), **kwargs)
            _user_hook(ref, case.get("extra"))
            ref_losses, ref_grads = _train(ref, batch, case.get("extra"))
            names = dict(model.named_parameters())
            unit_of = {id(names[n]): u for u, x in enumerate(w.trace.layers) for n in x.param_names}
            r.update(
                losses=losses,
                ref_losses=ref_losses,
                grad_diff=_diff({_strip(k): v for k, v in grads.items()}, {
                    _strip(k): v for k, v in ref_grads.items()}),
                param_diff=_diff(_params(ddp), _params(ref)),
                replicas=_same_on_all_ranks(_fingerprint(model)),
                plan=[list(g) for g in caps.plan.groups],
                buckets=[[sorted({unit_of[id(names[n])] for n in b}), str(names[b[0]].dtype)]
                         for b in caps.param_groups],  # one dtype each: a group per dtype it holds
                requested=[list(g) for g in caps.requested.groups],
                dropped=list(caps.dropped),
                walk=caps.walk,
                seen=None if case.get("extra") in HOOKED else _recorded_buckets(
                    getattr(ddp, "_orig_mod", ddp), batch, unit_of, dtypes=True
                ),
            )  # fmt: skip
            del ddp, ref
        except Exception as exc:  # one case's failure is reported, the others still run
            r["error"] = f"{type(exc).__name__}: {exc}"
            r["trace"] = traceback.format_exc(limit=4)
        out.append(r)
    return out


def _bad_wrap(kind: str, rank: int) -> None:
    from dpcomm.ddp import wrap

    build, batch_of, _ = CORPUS["lora"]
    torch.manual_seed(rank if kind == "weights" else 0)
    model = build()
    x = batch_of(rank)[0]
    if kind == "planner":
        wrap(model, "fastest-please", example=x)
    elif kind == "shape" or (kind == "shape-on-rank-1" and rank == 1):
        wrap(model, "optimal", example=torch.randn(4, 7))
    elif kind == "shape-on-rank-1":
        wrap(model, "optimal", example=x)
    elif kind == "no-params":
        wrap(nn.ReLU(), "wfbp", example=x)
    elif kind == "weights":
        wrap(model, "wfbp", example=x)
    elif kind == "unused":
        torch.manual_seed(0)
        gpt_build, gpt_batch, _ = CORPUS["sdpa-gpt"]
        wrap(gpt_build(), "mgwfbp", example=gpt_batch(rank)[0])


def _skewed(module: Any, rank: int) -> Any:
    """On rank 1, ``module.agree`` returns the units in reverse: the layout differs from rank 0's (a layout
    check must catch it before anything trains); restore with ``module.agree = <the result>``."""
    import dataclasses

    real = module.agree
    if rank == 1:
        module.agree = lambda *a: (lambda x: dataclasses.replace(x, units=x.units[::-1]))(real(*a))
    return real


def _mismatch(door: str, rank: int) -> None:
    """Rank 1 analyses the model differently from rank 0 (forced): ``wrap`` or ``shard`` must refuse."""
    import importlib

    module = importlib.import_module("dpcomm.ddp.wrap" if door == "wrap" else "dpcomm.fsdp.shard")
    build, batch_of, _ = CORPUS["moe-top1"]
    torch.manual_seed(0)
    real = _skewed(module, rank)
    try:
        if door == "wrap":
            module.wrap(build(), "wfbp", example=batch_of(10 + rank)[0], find_unused_parameters=True)
        else:
            module.shard(build(), "per-layer", example=batch_of(10 + rank)[0])
    finally:
        module.agree = real


def bad_inputs(kinds: list[str]) -> list[dict[str, str]]:
    """Per kind of bad input, what each rank raised: ``{type, message}`` (no hang: the launch returns)."""
    rank, _ = init_worker(timeout_s=30.0)
    torch.set_num_threads(1)
    out = []
    for kind in kinds:
        try:
            if kind.endswith("-layout"):
                _mismatch(kind.removesuffix("-layout"), rank)
            elif kind.startswith("shard-"):
                _bad_shard(kind.removeprefix("shard-"), rank)
            else:
                _bad_wrap(kind, rank)
            out.append({"type": "none", "message": ""})
        except Exception as exc:
            out.append({"type": type(exc).__name__, "message": str(exc)})
    return out


def _bad_shard(kind: str, rank: int) -> None:
    import dpcomm.fsdp

    build, batch_of, _ = CORPUS["encoder"]
    torch.manual_seed(rank if kind == "weights" else 0)
    model = build()
    x = batch_of(rank)[0]
    if kind == "planner":
        dpcomm.fsdp.shard(model, "fastest-please", example=x)
    elif kind == "shape":
        dpcomm.fsdp.shard(model, "optimal", example=torch.randn(4, 7))
    elif kind == "budget":
        dpcomm.fsdp.shard(model, "optimal", example=x, memory=64)
    elif kind == "no-params":
        dpcomm.fsdp.shard(nn.ReLU(), "per-block", example=x)
    elif kind == "weights":
        dpcomm.fsdp.shard(model, "per-block", example=x)
    elif kind == "mixed-dtypes":  # bf16 linears, fp32 norms: FSDP2 asserts on a call that mixes them
        torch.manual_seed(0)
        mixed = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 4))
        mixed[0].bfloat16(), mixed[2].bfloat16()
        x = torch.randn(6, 16, dtype=torch.bfloat16)
        dpcomm.fsdp.shard(mixed, "optimal", example=x, loss_fn=lambda out: out.float().pow(2).mean())
    elif kind == "sparse":  # FSDP2 cannot reduce-scatter a sparse gradient: one line, not its traceback
        torch.manual_seed(0)
        sparse = nn.Sequential(nn.Embedding(32, 16, sparse=True), nn.Linear(16, 4))
        dpcomm.fsdp.shard(sparse, "optimal", example=torch.randint(0, 32, (4, 8)))
    elif kind == "frozen-budget":  # the frozen backbone is gathered whole: 1,000 bytes cannot hold it
        build, batch_of, _ = CORPUS["frozen"]
        dpcomm.fsdp.shard(build(), "optimal", example=batch_of(rank)[0], memory=1000)


def _view_warnings(caught: list[Any], model: nn.Module) -> list[str]:
    """FSDP2's "returned a view tensor" warnings about any module but the root (a root that returns a
    view warns under plain ``fully_shard(model)`` too)."""
    root = type(model).__name__
    out = []
    for m in caught:
        text = str(m.message)
        if "returned a view tensor" in text and f"({root})" not in text:
            out.append(text[:120])
    return out


def _fsdp_alive() -> set[int]:

    from torch.distributed.fsdp import FSDPModule

    return {id(o) for o in gc.get_objects() if issubclass(type(o), FSDPModule)}  # type(): a dead proxy raises


def _lingering_fsdp(model: nn.Module, before: set[int]) -> int:
    """FSDP2 modules made since ``before`` and still alive that are not the user's model's (the trial's
    copies, left to the interpreter's teardown, ended jobs in SIGABRT: issue 46, finding 3)."""
    return len(_fsdp_alive() - before - {id(m) for m in model.modules()})


def _held_in_forward(model: nn.Module, x: Any) -> int:
    """The most parameter bytes FSDP2 holds unsharded at any module's forward entry or exit in one forward
    of ``x`` (read from its parameters' states), every parameter counted, frozen ones included."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState

    groups = {id(g): g for m in model.modules() if isinstance(m, FSDPModule)
              for g in [m._get_fsdp_state()._fsdp_param_group] if g is not None}  # fmt: skip
    params = [fp for g in groups.values() for fp in g.fsdp_params]  # a call on a list: one group
    peak = [0]

    def hold(*_: Any) -> None:
        now = sum(
            fp._orig_size.numel() * fp.orig_dtype.itemsize
            for fp in params
            if fp.sharded_state == ShardedState.UNSHARDED
        )
        peak[0] = max(peak[0], now)

    hooks = [m.register_forward_pre_hook(hold) for m in model.modules()]
    hooks += [m.register_forward_hook(hold) for m in model.modules()]
    try:
        with torch.no_grad():
            call(model, x)
    finally:
        for h in hooks:
            h.remove()
    return peak[0]


def shard_cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case ``{model, planner, memory (fraction of the parameters' bytes or None), meta}``: ``shard``
    against plain DDP from the same weights and random state (a meta-device model is built on ``meta``,
    sharded, then materialised with ``to_empty`` and loaded with the reference's full state dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    import dpcomm.fsdp

    rank = _start()
    out = []
    for case in cases:
        build, batch_of, modes = {**CORPUS, **ZOO}[case["model"]]
        torch.manual_seed(0)
        plain = build()
        full = {k: v.clone() for k, v in plain.state_dict().items()}
        if case.get("meta"):
            with torch.device("meta"):
                model = build()
        else:
            model = copy.deepcopy(plain)
        batch = batch_of(10 + rank)
        total = sum(p.numel() * p.element_size() for p in plain.parameters())
        memory = case.get("memory_bytes") or (
            None if case.get("memory") is None else int(case["memory"] * total)
        )
        torch.manual_seed(100 + rank)
        alive = _fsdp_alive()
        before = _rng()
        r: dict[str, Any] = {}
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model = dpcomm.fsdp.shard(model, case["planner"], example=batch[0], memory=memory,
                                          profile_iters=1, verify_iters=case.get("verify_iters", 1),
                                          mesh=case.get("mesh"))  # fmt: skip
                r["rng_same"] = bool(torch.equal(before, _rng()))
                r["lingering"] = _lingering_fsdp(model, alive)
                if case.get("meta"):  # materialise and initialise after sharding, torchtitan's way
                    model.to_empty(device="cpu")
                    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True))
                    torch.set_rng_state(before)
                losses, grads = _train(model, batch, case.get("extra"))
            r["view_warnings"] = _view_warnings(caught, model)
            r["text"] = str(model.dpcomm)
            r["units"] = len(model.dpcomm.plan.units)
            r["shard_group"] = model.dpcomm.plan.shard_group
            r["priced_all_reduce"] = model.dpcomm.ar_cost is not None  # HSDP's third collective, fitted
            p0 = next(model.parameters())  # a DTensor: the mesh and placements FSDP2 runs
            r["mesh_shape"] = list(p0.device_mesh.shape)
            r["placements"] = [type(x).__name__ for x in p0.placements]
            r["bound"] = model.dpcomm.peak_bound_bytes
            r["held"] = _held_in_forward(model, batch[0])
            r["memory"] = memory
            torch.set_rng_state(before)
            kw = {} if modes[0] == {} else {"find_unused_parameters": True}
            ref = DistributedDataParallel(plain, **kw)
            ref_losses, ref_grads = _train(ref, batch, case.get("extra"))
            r.update(
                losses=losses,
                ref_losses=ref_losses,
                grad_diff=_diff(grads, _none_as_zero(grads, ref_grads)),
                param_diff=_diff(_params(model), _params(ref)),
                replicas=_same_on_all_ranks(_fingerprint(model)),
            )
            del model, ref
        except Exception as exc:
            r["error"] = f"{type(exc).__name__}: {exc}"
            r["trace"] = traceback.format_exc(limit=6)
        out.append(r)
    return out
