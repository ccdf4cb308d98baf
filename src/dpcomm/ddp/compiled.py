"""dpcomm's DDP plans under ``torch.compile``: the graph splits at the plan's cuts.

Compiled DDP (dynamo's default ``torch._dynamo.config.optimize_ddp = "ddp_optimizer"``, engaged for
``DistributedDataParallel(torch.compile(model))``, i.e. ``wrap(torch.compile(model), ...)``) runs the model
as several compiled subgraphs: dynamo's ``DDPOptimizer`` (``torch/_dynamo/backends/distributed.py``) walks
the forward graph from its output back, adds each parameter's bytes to the open bucket and starts a new
subgraph once it holds ``ddp_module.bucket_bytes_cap`` (one size for every bucket: the largest cap of a
plan's ``bucket_cap_mb_list``). A gradient is ready only when its subgraph's backward ends, so a bucket of
the plan can start its all-reduce only there: with one size, the ready times are not the planner's
(pytorch/pytorch#108966), and a plan whose caps are all under 1 MiB trips its assertion "First bucket should
be smaller/equal to other buckets" (``wfbp``).

:func:`install` replaces ``DDPOptimizer`` (the name dynamo looks up each time it compiles for a DDP module)
with :class:`PlannedDDPOptimizer`, which for a DDP built by :func:`dpcomm.ddp.wrap` cuts the graph before
the first node that uses a parameter of the plan's next group (a parameter counted where its gradient
completes: at its use nearest the graph's input, as a tied weight's is), and leaves every other DDP module
to dynamo's own rule. DDPOptimizer keeps a subgraph going past a cut when the nodes so far have no output
used later; then the splits differ from the plan, and one warning on rank 0 says which groups share a
subgraph. What was split is recorded on ``ddp.dpcomm.compiled_splits`` (dynamo's own ``buckets``, as
parameter names per subgraph, communication order).

Compiled autograd (``optimize_ddp = "python_reducer"``) traces DDP's all-reduces into the backward graph,
where inductor buckets them; DDP refuses ``bucket_cap_mb_list`` there, so :func:`dpcomm.ddp.wrap` builds
DDP without it and the plan reaches inductor's fusion through marked hooks and a graph pass
(:mod:`dpcomm.ddp.compiled_autograd`).
"""

from __future__ import annotations

import logging
import operator
import warnings
from typing import Any

import torch
from torch import nn

__all__ = [
    "PlannedDDPOptimizer",
    "backend_name",
    "backend_of",
    "install",
    "placeholder_name",
    "python_reducer_active",
    "split_flags",
    "time_compiled",
]

_log = logging.getLogger("dpcomm.ddp")
_NEVER = 1 << 62
"""A bucket cap no subgraph reaches (bytes)."""

PlannedDDPOptimizer: Any = None
"""The installed class (None until :func:`install`)."""


def python_reducer_active() -> bool:
    """Dynamo will trace DDP's all-reduces into compiled autograd (``optimize_ddp = "python_reducer"``)."""
    import torch._dynamo

    return str(torch._dynamo.config.optimize_ddp) == "python_reducer"


def placeholder_name(param_name: str) -> str:
    """The graph input dynamo makes of parameter ``a.b.weight`` of the compiled module (``self``):
    ``L_self_modules_a_modules_b_parameters_weight_`` (its source name, torch 2.13)."""
    *mods, leaf = param_name.split(".")
    return "L_self_" + "".join(f"modules_{m}_" for m in mods) + f"parameters_{leaf}_"


def _placeholder_param(arg: Any, by_placeholder: dict[str, nn.Parameter]) -> nn.Parameter | None:
    if not isinstance(arg, torch.fx.Node) or arg.op != "placeholder":
        return None
    if str(arg.target) in by_placeholder:  # a fake tensor named after its source (inlined modules)
        return by_placeholder[str(arg.target)]
    p = arg.meta.get("example_value")  # a parameter, or a fake one (it passes isinstance(_, Parameter))
    return p if isinstance(p, nn.Parameter) and p.requires_grad else None


def _node_params(
    gm: torch.fx.GraphModule, node: torch.fx.Node, by_placeholder: dict[str, nn.Parameter]
) -> list[nn.Parameter]:
    """The trainable parameters ``node`` uses, found where DDPOptimizer looks (placeholder arguments,
    a called module's parameters, attributes)."""
    out: list[nn.Parameter] = []
    if node.op in ("call_function", "call_method"):
        for arg in node.args:
            p = _placeholder_param(arg, by_placeholder)
            if p is not None:
                out.append(p)
    if node.op == "call_module" or (node.op == "call_method" and node.args
                                    and isinstance(getattr(node.args[0], "target", None), str)):  # fmt: skip
        target = node.target if node.op == "call_module" else node.args[0].target
        try:
            out += [p for p in gm.get_submodule(target).parameters() if p.requires_grad]
        except AttributeError:
            pass
    if node.op == "get_attr":
        p = getattr(gm, node.target, None)
        if isinstance(p, nn.Parameter) and p.requires_grad:
            out.append(p)
    return out


def split_flags(
    gm: torch.fx.GraphModule, group_of: dict[int, int], by_placeholder: dict[str, nn.Parameter]
) -> list[bool]:
    """Per node of ``gm`` that DDPOptimizer walks (reverse order, no placeholders or output): cut before it?
    ``group_of``: parameter id -> the plan's group (communication order). A parameter counts at its last use
    in the walk (its gradient completes there); a cut falls before the first node that counts a parameter of
    a later group than the open one."""
    walk = [n for n in reversed(gm.graph.nodes) if n.op not in ("output", "placeholder")]
    uses = [[id(p) for p in _node_params(gm, n, by_placeholder) if id(p) in group_of] for n in walk]
    last = {pid: i for i, ids in enumerate(uses) for pid in ids}
    flags, open_group = [], None
    for i, ids in enumerate(uses):
        counted = [group_of[pid] for pid in ids if last[pid] == i]
        g = max(counted) if counted else None
        cut = g is not None and open_group is not None and g > open_group
        flags.append(cut)
        if g is not None and (open_group is None or g > open_group):
            open_group = g
    index = {n: i for i, n in enumerate(walk)}
    for i in [i for i, f in enumerate(flags) if f]:  # a tuple and its getitems stay in one subgraph:
        taken = [index[u] for u in walk[i].users if u.target is operator.getitem and u in index]
        if taken and min(taken) < i:  # (a tuple crossing subgraphs fails to compile: nn.MultiheadAttention's)
            flags[i], flags[min(taken)] = False, True
    return flags


def install() -> None:
    """Make dynamo split a dpcomm-wrapped DDP's graph at its plan's cuts (module docstring); idempotent."""
    global PlannedDDPOptimizer
    from torch._dynamo.backends import distributed as backend

    if getattr(backend.DDPOptimizer, "_dpcomm", False):
        return
    base = backend.DDPOptimizer

    class _Planned(base):  # type: ignore[misc, valid-type]
        _dpcomm = True

        def __init__(self, bucket_bytes_cap: int, backend_compile_fn: Any, first_bucket_cap: Any = None):
            from torch.nn.parallel import DistributedDataParallel

            ddp = DistributedDataParallel._get_active_ddp_module()
            self._ddp = ddp if getattr(ddp, "dpcomm", None) is not None else None
            self._flags: list[bool] = []
            self._by_placeholder: dict[str, nn.Parameter] = {}
            if self._ddp is None:  # not ours: dynamo's own rule
                super().__init__(bucket_bytes_cap, backend_compile_fn, first_bucket_cap)
            else:  # no size ever closes a subgraph; the flags do (bucket_bytes_cap below)
                super().__init__(_NEVER, backend_compile_fn, first_bucket_cap=_NEVER)

        @property
        def bucket_bytes_cap(self) -> int:  # read once per node walked, before the node is added
            if self._ddp is None:
                return self._cap
            return 0 if (self._flags and self._flags.pop(0)) else _NEVER

        @bucket_bytes_cap.setter
        def bucket_bytes_cap(self, value: int) -> None:
            self._cap = value

        def add_param_args(self, bucket: Any, node: torch.fx.Node) -> None:
            if self._ddp is None:
                return super().add_param_args(bucket, node)
            for arg in node.args:  # a fake tensor named after its parameter counts as that parameter
                p = _placeholder_param(arg, self._by_placeholder)
                if p is not None:
                    self.add_param(bucket, p, str(arg.target))

        def compile_fn(self, gm: torch.fx.GraphModule, example_inputs: list[Any], **kw: Any) -> Any:
            if self._ddp is None:
                return super().compile_fn(gm, example_inputs, **kw)
            w = self._ddp.dpcomm
            names = {n.removeprefix("_orig_mod."): q for n, q in self._ddp.module.named_parameters()}
            self._by_placeholder = {placeholder_name(n): q for n, q in names.items() if q.requires_grad}
            group_of = {id(names[n]): k for k, g in enumerate(w.caps.param_groups) for n in g if n in names}
            self._flags = split_flags(gm, group_of, self._by_placeholder)
            wanted = sum(self._flags) + 1
            out = super().compile_fn(gm, example_inputs, **kw)
            self._flags = []
            got = [list(b.params) for b in reversed(self.buckets)]  # dynamo lists them in forward order
            w.compiled_splits.append(got)
            if len(self.buckets) != wanted:
                _warn_once(
                    self._ddp,
                    f"dpcomm: the compiled graph runs {len(self.buckets)} subgraphs where plan "
                    f"'{w.plan.schedule}' has {wanted} groups in it (DDPOptimizer kept a subgraph going "
                    "where its nodes had no later use)",
                )
            return out

    PlannedDDPOptimizer = _Planned
    backend.DDPOptimizer = _Planned


def _warn_once(ddp: Any, message: str) -> None:
    import torch.distributed as dist

    said = ddp.dpcomm.compiled_notes
    if message not in said:
        said.append(message)
        if not dist.is_initialized() or dist.get_rank() == 0:
            warnings.warn(message, stacklevel=3)


def capture_graph(model: nn.Module, example: Any) -> torch.fx.GraphModule:
    """The FX graph dynamo makes of ``model``'s forward on ``example`` (one traced call with a capturing
    backend, its own cache entry: the user's compiled module is not touched). Run it under
    :func:`dpcomm.utils.user_run.untouched`."""
    graphs: list[torch.fx.GraphModule] = []

    def capture(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    fn = torch.compile(model, backend=capture, dynamic=False)
    from dpcomm.utils.user_run import call

    call(fn, example)
    if len(graphs) != 1:
        from dpcomm.errors import UserError

        raise UserError(
            f"dynamo made {len(graphs)} graphs of the model's forward (graph breaks); dpcomm plans one graph"
        )
    return graphs[0]


def backend_of(compiled: nn.Module) -> Any:
    """The backend ``torch.compile(model, backend=...)`` gave ``compiled`` (dynamo's wrappers unwrapped: a
    callable ``backend(gm, example_inputs)``), or None for a module ``torch.compile`` did not make."""
    fn = getattr(getattr(compiled, "dynamo_ctx", None), "callback", None)
    while fn is not None and hasattr(fn, "_torchdynamo_orig_backend"):
        fn = fn._torchdynamo_orig_backend
    return fn


def backend_name(backend: Any) -> str:
    """A readable name of a backend :func:`backend_of` returned (``aot_eager``, ``inductor``, a function's
    name)."""
    name = getattr(backend, "_compiler_name", None) or getattr(backend, "compiler_name", None)
    return str(name or getattr(backend, "__name__", None) or type(backend).__name__)


def time_compiled(
    model: nn.Module,
    compiled: nn.Module,
    example: Any,
    *,
    loss_fn: Any = None,
    iters: int = 3,
    warmup: int = 2,
) -> tuple[float, float]:
    """Median forward and backward seconds of one training pass of a copy of ``model`` compiled as
    ``compiled`` was (its backend), without DDP and so without communication. The copy is compiled through a
    backend object of its own, which gives it its own dynamo cache entry (dynamo guards on the backend): the
    user's compiled module, which DDP will run, reuses nothing of it and is split at the plan's cuts when
    it first runs. ``warmup`` passes first (the first compiles). Run it under
    :func:`dpcomm.utils.user_run.untouched` (the copy draws from the random state)."""
    import copy

    from dpcomm.trace.profiler import time_iteration

    backend = backend_of(compiled)
    if backend is None:
        from dpcomm.errors import UserError

        raise UserError("dpcomm.ddp.wrap: the compiled model's backend could not be found (dynamo_ctx)")

    def separate(gm: torch.fx.GraphModule, inputs: Any) -> Any:  # the same compiler, another cache entry
        return backend(gm, inputs)

    replica = copy.deepcopy(model)
    device = next(replica.parameters()).device
    fn = torch.compile(replica, backend=separate)
    try:
        return time_iteration(fn, example, iters=iters, warmup=warmup, device=device, loss_fn=loss_fn)
    finally:
        del fn, replica


def graph_atoms(gm: torch.fx.GraphModule, unit_params: list[tuple[str, ...]], model: nn.Module) -> list[int]:
    """Sizes (in units, forward order) of the runs of units that dynamo's graph can be cut between: two
    units one graph node uses, or a tuple and its getitems would separate, are one run. ``unit_params``:
    each unit's parameter names (forward order)."""
    names = dict(model.named_parameters())
    last = len(unit_params) - 1
    group_of = {id(names[n]): last - u for u, ps in enumerate(unit_params) for n in ps}  # communication order
    by_placeholder = {placeholder_name(n): p for n, p in names.items() if p.requires_grad}
    flags = split_flags(gm, group_of, by_placeholder)
    walk = [n for n in reversed(gm.graph.nodes) if n.op not in ("output", "placeholder")]
    uses = [[id(p) for p in _node_params(gm, n, by_placeholder) if id(p) in group_of] for n in walk]
    at = {pid: i for i, ids in enumerate(uses) for pid in ids}  # where each parameter counts (last use)
    bucket, buckets = 0, []
    for f in flags:
        bucket += f
        buckets.append(bucket)
    bucket_of = [max((buckets[at[id(names[n])]] for n in ps if id(names[n]) in at), default=None)
                 for ps in unit_params]  # fmt: skip
    # a parameter used in two subgraphs (a tied weight) gets its gradient twice, in an order the compiled
    # backward decides, not the walk: its unit is not cut from the next one
    spread = {pid for pid in at if len({buckets[i] for i, ids in enumerate(uses) if pid in ids}) > 1}
    tied = {u for u, ps in enumerate(unit_params) if any(id(names[n]) in spread for n in ps)}
    sizes, run = [], 0
    for u in range(len(unit_params)):  # forward order: bucket numbers fall (the walk starts at the output)
        run += 1
        here, nxt = bucket_of[u], bucket_of[u + 1] if u < last else None
        if u == last or (u not in tied and here is not None and nxt is not None and nxt < here):
            sizes.append(run)
            run = 0
    return sizes
