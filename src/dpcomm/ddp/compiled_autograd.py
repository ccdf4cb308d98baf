"""dpcomm's DDP plans under compiled autograd (``torch._dynamo.config.optimize_ddp = "python_reducer"``).

What torch 2.13 does in this mode (``torch/nn/parallel/distributed.py``, ``torch/_inductor/fx_passes/``):

1. ``DistributedDataParallel.__init__`` reads the mode once (``self._use_python_reducer``), refuses
   ``bucket_cap_mb_list`` (``_BucketCapacityConfig.create``: "when using bucket_cap_mb_list, python reducer
   is not supported"), sets inductor's globals ``_fuse_ddp_communication = True`` and
   ``_fuse_ddp_bucket_size = bucket_cap_mb``, and registers one post-accumulate-grad hook per parameter
   (``_register_accum_grad_hook``): ``param.grad.copy_(all_reduce(param.grad / world, "sum"))`` with the
   functional collectives. DDP's forward then runs no reducer at all.
2. With compiled autograd on (``torch._dynamo.compiled_autograd._enable(compiler)`` around the backward, or
   ``torch._dynamo.config.compiled_autograd = True`` when compiling a function that calls ``backward``), the
   backward graph is traced with those hooks in it: one ``_c10d_functional.all_reduce`` per parameter, in
   gradient-ready order (``AutogradCompilerInstance.reorder_post_acc_grad_hook_nodes``).
3. Inductor's post-grad passes (``fx_passes/post_grad.py``) run ``config._fuse_ddp_communication_passes``
   on it (default ``fuse_ddp_with_concat_op``, then ``schedule_comm_wait``): ``ddp_fusion.
   _bucket_size_fusion`` walks the all-reduces in graph order and closes a bucket at 1 MiB for the first,
   then at ``_fuse_ddp_bucket_size`` MiB, each bucket one ``cat`` -> ``all_reduce`` -> ``split``. (The
   newer ``bucket_all_reduces_fx`` pass, off by default, asks its size determinator once, for bucket 0.)
   Only inductor runs these passes; ``aot_eager`` leaves one all-reduce per parameter.

What dpcomm does (:func:`plan_hooks`, called by :func:`dpcomm.ddp.wrap` in this mode): DDP is built without
caps and its hooks are replaced by the same hook with a marker, ``dpcomm::planned_grad(grad, key, bucket,
index)`` (a copy of ``grad``; the plan's group and the parameter's position, constants of the traced graph),
so that every all-reduce in the compiled backward says whose gradient it carries. :func:`install` puts
:func:`fuse_by_plan` where ``fuse_ddp_with_concat_op`` was: it removes the markers and fuses the marked
all-reduces one bucket per plan group, with inductor's own concat fusion (``ddp_fusion._fuse_allreduce``,
at the group's last gradient); unmarked all-reduces (another DDP) get inductor's greedy buckets. Each
graph's fused all-reduces, read back from the graph after the pass, are recorded on
``ddp.dpcomm.compiled_buckets`` (parameter names per all-reduce, graph order). A raw callable in that list
makes inductor bypass its FX graph cache while it is installed (``codecache.py``), so the pass runs on
every compile.
"""

from __future__ import annotations

import functools
import itertools
import operator
from typing import Any

import torch
from torch import nn

__all__ = ["MARKER", "conflict", "fuse_by_plan", "install", "plan_hooks", "read_buckets"]

MARKER = "dpcomm::planned_grad"
"""The custom op that carries a gradient's plan group and parameter index into the compiled graph."""

_RECORDS: dict[int, tuple[tuple[str, ...], list[list[list[str]]]]] = {}
"""Per wrapped DDP (``key``): its parameter names (plan order) and the list its graphs' buckets go to."""
_KEYS = itertools.count()


@torch.library.custom_op(MARKER, mutates_args=())
def planned_grad(grad: torch.Tensor, key: int, bucket: int, index: int) -> torch.Tensor:
    """``grad``, copied (a custom op may not return its input): the mark :func:`fuse_by_plan` reads."""
    return grad.clone()


@planned_grad.register_fake
def _(grad: torch.Tensor, key: int, bucket: int, index: int) -> torch.Tensor:
    return torch.empty_like(grad)


def plan_hooks(ddp: Any, param_groups: tuple[tuple[str, ...], ...], record: list[list[list[str]]]) -> None:
    """Replace the python reducer's hooks of ``ddp`` with marked ones (module docstring): parameter
    ``param_groups[k][i]`` is marked with bucket ``k``. ``record`` gets each compiled graph's buckets."""
    import torch.distributed._functional_collectives as fcol

    names = {n.removeprefix("_orig_mod."): p for n, p in ddp.module.named_parameters()}
    planned = {id(names[n]) for g in param_groups for n in g}  # by identity: a tied weight has two names
    rest = tuple(n for n, p in names.items() if p.requires_grad and id(p) not in planned)
    if rest:  # never left without its all-reduce: a trainable parameter outside the plan, one bucket more
        param_groups = (*param_groups, rest)
    order = tuple(n for g in param_groups for n in g)
    key = next(_KEYS)
    _RECORDS[key] = (order, record)
    for h in ddp._accum_grad_hooks:  # DDP's own (_register_accum_grad_hook), one per parameter
        h.remove()
    ddp._accum_grad_hooks.clear()

    def hook(param: nn.Parameter, *, bucket: int, index: int) -> None:  # DDP's hook, marked
        if not ddp.require_backward_grad_sync or param.grad is None:
            return
        if ddp._comm_hooks:  # a user's comm hook runs as in DDP, unplanned
            for h, state in ddp._comm_hooks:
                h(state, (param.grad, param))
            return
        grad = torch.ops.dpcomm.planned_grad(param.grad, key, bucket, index)
        gradient = fcol.all_reduce(grad / ddp.process_group.size(), "sum", ddp.process_group)
        param.grad.copy_(gradient)

    index = 0
    for k, group in enumerate(param_groups):
        for n in group:
            ddp._accum_grad_hooks.append(
                names[n].register_post_accumulate_grad_hook(functools.partial(hook, bucket=k, index=index))
            )
            index += 1


def install() -> None:
    """Put :func:`fuse_by_plan` in place of inductor's greedy DDP fusion (idempotent)."""
    import torch._inductor.config as config

    passes = config._fuse_ddp_communication_passes
    if fuse_by_plan in passes:
        return
    greedy = ("fuse_ddp_with_concat_op", "fuse_ddp_with_coalesced_op")
    kept = [p for p in passes if p not in greedy]
    config._fuse_ddp_communication_passes = [fuse_by_plan, *kept]


def conflict() -> str | None:
    """One line when inductor will re-bucket after :func:`fuse_by_plan`: ``bucket_all_reduces_fx`` (a later
    post-grad pass, ``fx_passes/bucketing.bucket_all_reduce``) merges consecutive all-reduces greedily,
    the plan's fused ones included."""
    import torch._inductor.config as config

    if config.bucket_all_reduces_fx == "none":
        return None
    return (
        f"dpcomm: inductor's bucket_all_reduces_fx='{config.bucket_all_reduces_fx}' merges all-reduces after "
        "dpcomm's fusion, so the plan's buckets may run merged; set it to 'none' to run them as planned"
    )


def fuse_by_plan(graph: torch.fx.Graph, bucket_size_mb: float | None = None) -> None:
    """Inductor's ``fuse_ddp_with_concat_op`` with the plan's buckets for marked all-reduces (module
    docstring); unmarked ones are bucketed as inductor does (``bucket_size_mb``; 25 when DDP left it None)."""
    from torch._inductor.fx_passes import ddp_fusion

    target = torch.ops.dpcomm.planned_grad.default
    marks: dict[torch.fx.Node, tuple[int, int, int]] = {}
    for node in [n for n in graph.nodes if n.target is target]:
        grad, key, bucket, index = node.args
        for user in node.users:  # the division the all-reduce takes
            marks[user] = (key, bucket, index)
        grad.meta["dpcomm_param"] = (key, index)  # survives the fusion: read_buckets reads it
        node.replace_all_uses_with(grad)
        graph.erase_node(node)
    if not marks:
        return ddp_fusion.fuse_ddp_with_concat_op(graph, bucket_size_mb or 25)

    def buckets(graph: torch.fx.Graph, blocks: list[Any]) -> Any:
        mine: dict[tuple[int, int], list[Any]] = {}
        rest = []
        for b in blocks:
            mark = marks.get(b.comm_node.args[0])
            if mark is None:
                rest.append(b)
            else:
                mine.setdefault(mark[:2], []).append(b)
        yield from sorted(mine.values(), key=lambda bs: graph_order[bs[0].comm_node])
        yield from ddp_fusion._bucket_size_fusion(graph, rest, bucket_size_mb or 25)

    graph_order = {n: i for i, n in enumerate(graph.nodes)}
    ddp_fusion._fuse_ddp_communication(
        graph, buckets, functools.partial(ddp_fusion._fuse_allreduce, use_concat=True)
    )
    for key in {k for k, _, _ in marks.values()}:
        if key in _RECORDS:
            _RECORDS[key][1].append(read_buckets(graph, key))


def read_buckets(graph: torch.fx.Graph, key: int) -> list[list[str]]:
    """The all-reduces of ``graph`` that carry gradients of wrapped DDP ``key``, each as its parameters'
    names (graph order): an all-reduce's input traced back through inductor's ``div``/``cat``/``flatten``
    to the gradients :func:`fuse_by_plan` labelled."""
    names = _RECORDS[key][0] if key in _RECORDS else ()
    ops = (torch.ops._c10d_functional.all_reduce.default, torch.ops._c10d_functional.all_reduce_.default)
    out = []
    for node in graph.nodes:
        if node.target not in ops:
            continue
        found: list[str] = []
        stack = [node.args[0]]
        while stack:
            n = stack.pop()
            if not isinstance(n, torch.fx.Node):
                continue
            mark = n.meta.get("dpcomm_param")
            if mark is not None:
                if mark[0] == key:
                    found.append(names[mark[1]] if mark[1] < len(names) else str(mark[1]))
                continue
            if n.target in (torch.ops.aten.div.Tensor, torch.ops.aten.flatten.using_ints, torch.ops.aten.cat):
                stack += list(n.args[0]) if isinstance(n.args[0], (list, tuple)) else [n.args[0]]
            elif n.target is operator.getitem:
                stack.append(n.args[0])
        if found:
            out.append(sorted(found, key=names.index) if names else found)
    return out
