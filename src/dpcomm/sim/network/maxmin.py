"""Max-min fair rates of concurrent flows by progressive filling (Bertsekas & Gallager, Data Networks,
sec. 6.5.2; the solver at the heart of SimGrid's flow models).

One pure function: every flow's rate grows at the same pace until some link is full; the flows through a
full link are frozen at their rate, and the others keep growing, until every flow crosses a full link. A
flow may load a link with a weight (wire bytes per payload byte: headers on its own links, ACKs on the
reverse ones), so the constraint of link ``l`` is ``sum_f w[f, l] * rate[f] <= capacity[l]``. Each round
fills at least one link, so there are at most ``L`` rounds; a step of a symmetric collective needs one or two.

:func:`fill` is the same filling on a flat list of ``(flow, link, weight)`` entries, the form the flow
model builds (and, for a step too large to hold, :func:`fill_chunked` streams the entries chunk by chunk,
keeping only per-flow and per-link arrays): each round touches only the entries of flows still growing, and
a frozen flow's rate is the filling level it was frozen at. :func:`fill_many` fills many independent problems
at once (each its own rounds, its own level: the same arithmetic, so the same rates bit for bit as
:func:`fill` on each), and says which link froze each flow, so the flow model can tell when a flow set's
rates still hold after some flows have left (:mod:`.engine`). :func:`fill_paired` is :func:`fill_many` for
the flow model's own weights, with each flow's entries on its forward links only: a flow loads its link
``l`` with ``fwd`` and the reverse link ``l ^ 1`` with ``ack`` (its ACKs). Half the entries to carry from
round to round, and the same rates bit for bit (a link's load is summed in the same order).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["fill", "fill_chunked", "fill_many", "fill_paired", "maxmin_rates"]

_TIE = 1e-9  # links whose share is within 1e-9 of the least one fill in the same round


def maxmin_rates(capacity: np.ndarray, links: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Max-min fair rate of each flow (payload bytes/s).

    ``capacity``: ``(L,)`` wire bytes/s per link; ``links``: ``(F, K)`` link ids per flow, -1 where unused;
    ``weights``: ``(F, K)`` (or ``(K,)``, the same for every flow) wire bytes per payload byte on that link.
    A flow on no link with positive weight gets ``inf``.
    """
    links = np.asarray(links)
    w = np.broadcast_to(np.asarray(weights, dtype=float), links.shape)
    use = (links >= 0) & (w > 0)
    flow_of = np.nonzero(use)[0]  # one entry per (flow, link) pair, row by row
    return fill(capacity, flow_of, links[use], w[use], links.shape[0])


def fill(
    capacity: np.ndarray, flow_of: np.ndarray, link_of: np.ndarray, wt: np.ndarray, f_count: int
) -> np.ndarray:
    """Progressive filling on entries: flow ``flow_of[i]`` loads link ``link_of[i]`` with weight ``wt[i]``
    (> 0). Returns ``(f_count,)`` rates; a flow with no entry gets ``inf``."""
    rate = np.full(f_count, np.inf)  # a flow with entries is given its level when it freezes
    active = np.zeros(f_count, dtype=bool)
    active[flow_of] = True
    left = np.array(capacity, dtype=float)
    n_links, level = len(left), 0.0
    while flow_of.size:
        load = np.bincount(link_of, weights=wt, minlength=n_links)
        share = left[link_of] / load[link_of]  # every entry's link is loaded (its weight is > 0)
        d = max(float(share.min()), 0.0)
        level += d  # a frozen flow's rate: the sum of the rounds' increments, as rate += d each round
        full = share <= d * (1 + _TIE)
        if full.all():  # the last round: every flow still growing freezes here
            rate[flow_of] = level
            break
        left -= d * load
        left[link_of[full]] = 0.0
        frozen = flow_of[full]
        rate[frozen] = level
        active[frozen] = False
        keep = active[flow_of]
        flow_of, link_of, wt = flow_of[keep], link_of[keep], wt[keep]
    return rate


def fill_many(
    capacity: np.ndarray,
    lstart: np.ndarray,
    flow_of: np.ndarray,
    link_of: np.ndarray,
    wt: np.ndarray,
    prob_of: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`fill` of ``len(lstart)`` independent problems in one pass per round: problem ``i`` owns links
    ``lstart[i] .. lstart[i+1]-1`` (``capacity`` holds every problem's links, each problem's at least one)
    and flows ``f`` with ``prob_of[f] == i``; entries as for :func:`fill`, a problem's in the order
    :func:`fill` would get them. Each problem fills with its own increments and level, so its rates are
    :func:`fill`'s bit for bit (a link's load sums its entries in the same order).

    Returns ``(rate, froze, full_at)``: the rates (``inf`` for a flow without entries), the round in which
    each flow froze (0: none) and the round in which each link became full (0: never). A flow's links with
    ``full_at == froze`` are its bottlenecks: full, and no flow on them has a higher rate."""
    n_links, f_count = len(capacity), len(prob_of)
    lprob = np.repeat(np.arange(len(lstart)), np.diff(np.append(lstart, n_links)))
    rate = np.full(f_count, np.inf)
    froze = np.zeros(f_count, dtype=np.int32)
    full_at = np.zeros(n_links, dtype=np.int32)
    active = np.zeros(f_count, dtype=bool)
    active[flow_of] = True
    left = np.array(capacity, dtype=float)
    level = np.zeros(len(lstart))
    share = np.empty(n_links)
    rnd = 0
    while flow_of.size:
        rnd += 1
        load = np.bincount(link_of, weights=wt, minlength=n_links)
        loaded = load > 0
        share.fill(np.inf)
        np.divide(left, load, out=share, where=loaded)
        d = np.maximum(np.minimum.reduceat(share, lstart), 0.0)  # inf: a problem with nothing growing
        live = np.isfinite(d)
        level[live] += d[live]
        dl = np.where(live, d, 0.0)[lprob]  # a finished problem's links are unloaded: share inf, load 0
        full = share <= dl * (1 + _TIE)
        np.copyto(full_at, rnd, where=full)
        left -= dl * load
        np.copyto(left, 0.0, where=full)
        frozen = flow_of[full[link_of]]  # where every loaded link is full, all of a problem's flows
        rate[frozen] = level[prob_of[frozen]]
        froze[frozen] = rnd
        active[frozen] = False
        if not active.any():
            break
        keep = active[flow_of]
        flow_of, link_of, wt = flow_of[keep], link_of[keep], wt[keep]
    return rate, froze, full_at


_WEIGHTS: dict[tuple[float, float], np.ndarray] = {}


def _weights(fwd: float, ack: float, n: int) -> np.ndarray:
    """``[fwd, ack, fwd, ack, ...]`` (``[fwd, ...]`` where ``ack`` is 0), at least ``n`` long: one array per
    pair of weights, grown as needed and read only (tiling it anew for every batch was 5% of LP's time)."""
    got = _WEIGHTS.get((fwd, ack))
    if got is None or len(got) < n:
        per = 2 if ack > 0 else 1
        got = np.tile([fwd, ack][:per], max(n, 2 * len(got) if got is not None else n, 1 << 16) // per + 1)
        got.flags.writeable = False
        _WEIGHTS[(fwd, ack)] = got
    return got


def fill_paired(
    capacity: np.ndarray,
    lstart: np.ndarray,
    flow_of: np.ndarray,
    link_of: np.ndarray,
    prob_of: np.ndarray,
    fwd: float,
    ack: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`fill_many` where entry ``i`` loads link ``link_of[i]`` with ``fwd`` and its reverse
    ``link_of[i] ^ 1`` with ``ack`` (>= 0): links come in pairs ``2j, 2j + 1`` (each problem's links
    too, where ``ack > 0``), as a fabric numbers a cable's two directions; entries flow by flow.

    The same arithmetic as :func:`fill_many` on each flow's forward entries followed by its reverse ones
    (weights ``fwd``, ``ack``): a link's load adds its flows' weights one flow after the other, in the same
    order, so the rates are :func:`fill_many`'s bit for bit, provided no flow crosses a cable both ways
    (then a link gets at most one weight per flow and the order within a flow does not matter). A flow
    freezes when one of its links or their reverses fills. Returns ``(rate, froze, full_at)`` as
    :func:`fill_many`: a flow's bottlenecks are its links ``l`` or ``l ^ 1`` with ``full_at == froze``."""
    n_links, f_count = len(capacity), len(prob_of)
    lsize = np.diff(np.append(lstart, n_links))
    froze = np.zeros(f_count, dtype=np.int32)
    full_at = np.zeros(n_links, dtype=np.int32)
    left = np.array(capacity, dtype=float)
    level = np.zeros(len(lstart))
    levels = [level.copy()]  # each problem's level after each round: a flow's rate is its round's level
    share = np.empty(n_links)
    per = 2 if ack > 0 else 1
    wt = _weights(fwd, ack, per * len(flow_of))  # an entry's weights: fwd on its link, ack on the reverse
    event = np.empty(per * len(flow_of), dtype=link_of.dtype)
    rnd = 0
    while flow_of.size:
        rnd += 1
        m = per * len(link_of)
        event[:m:per] = link_of
        if ack > 0:
            np.bitwise_xor(link_of, 1, out=event[1:m:2])
        load = np.bincount(event[:m], weights=wt[:m], minlength=n_links)  # summed flow after flow
        loaded = load > 0
        share.fill(np.inf)
        np.divide(left, load, out=share, where=loaded)
        d = np.maximum(np.minimum.reduceat(share, lstart), 0.0)  # inf: a problem with nothing growing
        live = np.isfinite(d)
        level[live] += d[live]
        levels.append(level.copy())
        dl = np.repeat(np.where(live, d, 0.0), lsize)  # a finished problem's links: share inf, load 0
        full = share <= dl * (1 + _TIE)
        np.copyto(full_at, rnd, where=full)
        left -= dl * load
        np.copyto(left, 0.0, where=full)
        hit = full
        if ack > 0:  # a flow is frozen by its links and by their reverses
            hit = full.copy()
            hit[0::2] |= full[1::2]
            hit[1::2] |= full[0::2]
        froze[flow_of[hit[link_of]]] = rnd
        keep = froze[flow_of] == 0
        if not keep.any():
            break
        flow_of, link_of = flow_of[keep], link_of[keep]
    table = np.stack(levels)  # (rounds + 1, problems): row 0 stands for "never froze"
    table[0] = np.inf  # a flow without entries: inf
    rate = table.ravel()[froze.astype(np.int64) * table.shape[1] + prob_of]
    return rate, froze, full_at


def fill_chunked(
    capacity: np.ndarray,
    f_count: int,
    chunks: list[tuple[int, int]],
    entries: Callable[[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> np.ndarray:
    """:func:`fill` for a flow set too large to hold its entries: ``entries(i0, i1)`` gives the entries of
    flows ``i0..i1-1`` (flow ids relative to ``i0``), recomputed for each chunk of ``chunks`` in each round,
    so only ``(f_count,)`` and ``(L,)`` arrays persist. Same rounds, same rates as :func:`fill`."""
    rate = np.full(f_count, np.inf)
    active = np.zeros(f_count, dtype=bool)
    left = np.array(capacity, dtype=float)
    n_links, level = len(left), 0.0
    load = np.zeros(n_links)
    for i0, i1 in chunks:
        f, lk, w = entries(i0, i1)
        active[i0 + f] = True
        load += np.bincount(lk, weights=w, minlength=n_links)
    while True:
        loaded = load > 0
        if not loaded.any():
            return rate
        share = np.full(n_links, np.inf)
        share[loaded] = left[loaded] / load[loaded]
        d = max(float(share.min()), 0.0)
        level += d
        left -= d * load
        full = loaded & (share <= d * (1 + _TIE))
        left[full] = 0.0
        load = np.zeros(n_links)
        for i0, i1 in chunks:
            if not active[i0:i1].any():
                continue
            f, lk, w = entries(i0, i1)
            keep = active[i0 + f]
            f, lk, w = f[keep], lk[keep], w[keep]
            frozen = i0 + f[full[lk]]
            rate[frozen] = level
            active[frozen] = False
            keep = active[i0 + f]
            load += np.bincount(lk[keep], weights=w[keep], minlength=n_links)
