"""Pull plans for a parameter server: which layers' parameters a worker pulls together, before forward.

Source: Wang et al., "iBatch: Saving Ethernet Bandwidth ... batching parameter communication and forward
computation" (the iBatch paper), sections "Problem Formulation" (Eq. 1-5) and "Algorithm Design"
(Algorithms 1 and 2). Names follow the paper: ``C_i`` forward time of layer ``i``, ``Tt_i`` transfer time of
layer ``i``'s parameters (from all servers), ``Ts`` the start-up of one pull, ``l_k`` the last layer of
batch ``k``, ``N`` batches. Layers are 0-based here (the paper's layer ``i`` is our ``i - 1``).

This module is the public entry point (:func:`plan_pulls`, :func:`confirm_plan`, :func:`ibatch_margin`) and
re-exports the rest, so every name below imports from ``dpcomm.planner.pull``. The parts:

* :mod:`dpcomm.planner.pull_model`: the paper's execution-time model ``F_N`` (Eq. 1-4, generalised, with
  our forward slowdown ``d``), :func:`pull_time`, :func:`fit_slowdown` and :class:`PullPlan`;
* :mod:`dpcomm.planner.pull_ibatch`: Algorithms 1 and 2 (:func:`ibatch_forward`, :func:`ibatch_backward`)
  and how we read the choices they leave open;
* :mod:`dpcomm.planner.pull_optimal`: the exact dynamic program (``optimal``) and its proof.

A probe's verdict (ours): :func:`confirm_plan` keeps a plan whose measured ``F_N`` is within
:data:`CONFIRM_REL` of the model and otherwise falls back to the better of ``all`` and ``layer``; the model
stays the paper's. The parameter server's runtime does this by default (``PsSpec.probe``).

Methods (:func:`plan_pulls`):

``all``     one batch: pull everything, then forward (the default PS; paper Fig. 4(a)).
``layer``   one batch per layer: layer ``i``'s forward waits for its own pull (Fig. 4(b)).
``ibatch``  the paper's two greedy algorithms (Algorithm 1 chooses ``l_1, l_2, ..`` forwards, Algorithm 2
            ``l_{N-1}, l_{N-2}, ..`` backwards); the faster candidate under the model is kept (Fig. 4(c)).
            ``all`` and ``layer`` are candidates too, so ``ibatch`` is never slower than the better of
            them under the model: the greedy rules only look one batch ahead, and where start-ups cost
            nothing (``Ts`` = 0, as our parameter server's pulls on TCP measure) layer by layer is optimal
            while Algorithm 1 may still merge (ResNet-20 on the emulated cluster: 49.7 ms against 44.6).
            ``meta["algorithm"]`` names the candidate kept (``forward``, ``backward``, ``all``, ``layer``).
            A greedy candidate is kept only when the model has it faster than the better of ``all`` and
            ``layer`` by more than ``margin`` (:data:`IBATCH_MARGIN`, 1%; 5% with dedicated servers,
            :func:`ibatch_margin`); see there why.
``optimal`` the exact minimum of the model (:mod:`dpcomm.planner.pull_optimal`); ties go to the fewest
            batches.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from dpcomm.errors import UserError
from dpcomm.planner.pull_ibatch import ibatch_backward, ibatch_forward
from dpcomm.planner.pull_model import (
    SLOWDOWN_MAX,
    SLOWDOWN_NOISE,
    TIE_REL,
    Batches,
    PullPlan,
    check_slowdown,
    fit_slowdown,
    pull_inputs,
    pull_time,
)
from dpcomm.planner.pull_optimal import optimal_pulls

__all__ = [
    "CONFIRM_REL",
    "IBATCH_MARGIN",
    "IBATCH_MARGIN_DEDICATED",
    "PULL_METHODS",
    "SLOWDOWN_MAX",
    "SLOWDOWN_NOISE",
    "TIE_REL",
    "PullPlan",
    "confirm_plan",
    "fit_slowdown",
    "ibatch_margin",
    "ibatch_backward",
    "ibatch_forward",
    "plan_pulls",
    "pull_time",
]

PULL_METHODS = ("all", "layer", "ibatch", "optimal")
"""Pull-plan methods, in the order the CLI lists them."""

CONFIRM_REL = 0.10
""":func:`confirm_plan`: a probed plan that ran more than this fraction slower than the model is refuted.
On the testbed (2-core VM, ``docs/ps.md``), before this rule, the probes of 16 of 19 plans ran at
0.85-1.07 of the model; of the other three, two had three processes computing on two cores (1.21, 1.24)
and one was Algorithm 1's three batches with five co-located workers (the first batch 72% of the bytes):
1.31 in the probe and 1.44 in training, its first batch in at twice its modelled time every round, as the
servers' FIFO NIC queues let one worker's later batches go before another worker's first. With the rule,
23 probes ran at 0.87-1.10 and five plans were refuted at 1.10-1.22."""

IBATCH_MARGIN = 0.01
"""``ibatch`` keeps Algorithm 1's or 2's batches over the better of ``all`` and ``layer`` only for a modelled
gain of more than this fraction: a smaller gain is a bet against effects the model leaves out. One of them:
a server sends each batch to its workers one after the other, and the first gets a head start. ResNet-20,
two workers and one dedicated server at 100 Mbit/s (five runs): the first worker's ``F_N`` was 7-11 ms
shorter than the second's pulling everything and 13-21 ms shorter with Algorithm 1's three batches (72% of
the bytes in the first); layer by layer they were within 4 ms, and reversing the send order reversed it.
There Algorithm 1 was modelled 0.1-1% ahead of ``layer`` and measured 2-7% behind (13% in an earlier run;
``docs/ps.md``). 1% does not cover every such case: one of those runs gained 1.0003%, and with three
workers gains of 1.4-1.8% measured 2.5-3.1% behind. 2% would, but the paper's worked example (Fig. 4(c),
our numbers) gains 1.7% and would lose its three batches; dedicated servers that send to several workers,
where those losses were, take :data:`IBATCH_MARGIN_DEDICATED` instead. A greedy plan that *ties* the
better baseline (the same modelled time) is kept when it has fewer batches: that is the tie rule, and no
bet."""

IBATCH_MARGIN_DEDICATED = 0.05
"""``ibatch``'s margin with dedicated servers and two or more workers (:func:`ibatch_margin`): every
dedicated server then sends each batch to several workers, one after the other (every tensor is striped
over all servers, :mod:`dpcomm.ps.keys`). Measured on the testbed (2-core VM, ``docs/ps.md``), every
greedy plan modelled 0.1-1.8% ahead of ``layer`` in that placement ran behind it (two workers and one
server, three and one; up to 8.5% behind, 1.2% ahead in the model), and the three modelled 21.7-28.7%
ahead ran 27-35% ahead. No measured gain fell between 1.8% and 21.7%, so any margin in between separates
them; 5% leaves room both ways. Co-located servers keep :data:`IBATCH_MARGIN`: there greedy plans
modelled 1.1-5% ahead ran ahead (one modelled 13.3% ahead ran 5.9% behind, with three workers and their
servers on two cores, where one plan measured twice differs by up to 29%), and the simulated 72-node
reproduction is co-located."""


def confirm_plan(
    plan: PullPlan, compute_s, transfer_s, startup_s: float, measured_s: float, *, rel: float = CONFIRM_REL
) -> PullPlan:
    """``plan`` (made under the paper's model, ``d = 0``) if its measured ``F_N`` (``measured_s``, s; a
    forward beside its pulls, :meth:`dpcomm.ps.rank.PsRank._probe_overlap`) is at most ``1 + rel`` times
    the model's, else the better of ``all`` and ``layer`` under the model (ties: ``all``, one message),
    under ``plan``'s method name, ``meta["algorithm"]`` naming it. Either way ``meta`` records
    ``probe_s``, ``probe_model_s`` and ``confirmed``. A plan that is ``all`` or ``layer`` already is kept:
    the model has no better one to offer. A refuted plan is a fact about the network the model leaves out
    (:data:`CONFIRM_REL`); the baselines are what a user would otherwise run."""
    C, T, Ts = pull_inputs(compute_s, transfer_s, startup_s)
    L = C.size
    model = pull_time(plan.batches, C, T, Ts)
    ok = not np.isfinite(measured_s) or measured_s <= (1.0 + rel) * model
    facts = {"probe_s": float(measured_s), "probe_model_s": model, "confirmed": bool(ok)}
    if ok or plan.messages in (1, L):
        return replace(plan, meta={**plan.meta, **facts})
    base = min((plan_pulls(C, T, Ts, m) for m in ("all", "layer")), key=lambda p: (p.time_s, p.messages))
    meta = {
        **plan.meta,
        **facts,
        "algorithm": base.method,
        "refuted_batches": [list(b) for b in plan.batches],
    }
    return replace(base, method=plan.method, meta=meta)


def ibatch_margin(workers: int, servers: int) -> float:
    """``ibatch``'s margin for ``workers`` workers and ``servers`` dedicated servers (0: co-located):
    :data:`IBATCH_MARGIN_DEDICATED` where dedicated servers send to two or more workers, else
    :data:`IBATCH_MARGIN`."""
    return IBATCH_MARGIN_DEDICATED if servers >= 1 and workers >= 2 else IBATCH_MARGIN


def plan_pulls(
    compute_s,
    transfer_s,
    startup_s: float,
    method: str = "ibatch",
    *,
    slowdown: float = 0.0,
    margin: float = IBATCH_MARGIN,
) -> PullPlan:
    """The pull plan of ``method`` for per-layer forward times ``compute_s`` (``C_i``), per-layer transfer
    times ``transfer_s`` (``Tt_i``) and the start-up ``startup_s`` (``Ts``), all seconds, forward order;
    ``slowdown`` (``d``): the forward runs ``1 + d`` times slower while pulls are in flight (module
    docstring). The greedy algorithms are the paper's (they see ``C`` as given); their candidates, and
    ``optimal``, are timed with ``d``. ``margin``: ``ibatch``'s least gain of a greedy candidate over the
    better of ``all`` and ``layer`` (a fraction in [0, 1); :data:`IBATCH_MARGIN`)."""
    C, T, Ts = pull_inputs(compute_s, transfer_s, startup_s)
    if not 0.0 <= margin < 1.0:
        raise UserError(f"ibatch margin must be in [0, 1), not {margin!r}")
    d = check_slowdown(slowdown)
    L = C.size
    name = str(method).strip().lower()
    meta: dict[str, Any] = {}
    if name == "all":
        batches: Batches = [(0, L - 1)]
    elif name == "layer":
        batches = [(i, i) for i in range(L)]
    elif name == "ibatch":
        cands = {
            "forward": ibatch_forward(C, T, Ts),
            "backward": ibatch_backward(C, T, Ts),
            "all": [(0, L - 1)],
            "layer": [(i, i) for i in range(L)],
        }
        times = {k: pull_time(b, C, T, Ts, slowdown=d) for k, b in cands.items()}
        meta = {"candidates_s": times}
        best = min(times.values())
        tied = [k for k in times if times[k] <= best + TIE_REL * max(1.0, abs(best))]
        # equal modelled time: the fewest pulls (a baseline's name where the batches are the same)
        pick = min(tied, key=lambda k: (len(cands[k]), k not in ("all", "layer")))
        base = min(("all", "layer"), key=lambda k: (times[k], len(cands[k])))
        if base not in tied and best >= (1.0 - margin) * times[base]:  # a gain of at most the margin
            pick = base
        meta["algorithm"] = pick
        if margin:
            meta["margin"] = margin
        batches = cands[pick]
    elif name == "optimal":
        meta["dp_time_s"], batches = optimal_pulls(C, T, Ts, d)
    else:
        raise UserError(f"unknown pull method {method!r}: use one of {', '.join(PULL_METHODS)}")
    if d:
        meta["slowdown"] = d
    return PullPlan(
        method=name, num_layers=L, batches=batches, time_s=pull_time(batches, C, T, Ts, slowdown=d), meta=meta
    )
