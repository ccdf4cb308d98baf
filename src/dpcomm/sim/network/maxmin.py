"""Max-min fair rates of concurrent flows by progressive filling (Bertsekas & Gallager, Data Networks,
sec. 6.5.2; the solver at the heart of SimGrid's flow models).

One pure function: every flow's rate grows at the same pace until some link is full; the flows through a
full link are frozen at their rate, and the others keep growing, until every flow crosses a full link. A
flow may load a link with a weight (wire bytes per payload byte: headers on its own links, ACKs on the
reverse ones), so the constraint of link ``l`` is ``sum_f w[f, l] * rate[f] <= capacity[l]``. Each round
fills at least one link, so there are at most ``L`` rounds; a step of a symmetric collective needs one or two.
"""

from __future__ import annotations

import numpy as np

__all__ = ["maxmin_rates"]


def maxmin_rates(capacity: np.ndarray, links: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Max-min fair rate of each flow (payload bytes/s).

    ``capacity``: ``(L,)`` wire bytes/s per link; ``links``: ``(F, K)`` link ids per flow, -1 where unused;
    ``weights``: ``(F, K)`` (or ``(K,)``, the same for every flow) wire bytes per payload byte on that link.
    A flow on no link with positive weight gets ``inf``.
    """
    links = np.asarray(links)
    f_count = links.shape[0]
    w = np.broadcast_to(np.asarray(weights, dtype=float), links.shape)
    use = (links >= 0) & (w > 0)
    flow_of = np.nonzero(use)[0]  # one entry per (flow, link) pair; shrinks as flows freeze
    link_of = links[use]
    wt = w[use]
    active = np.zeros(f_count, dtype=bool)
    active[flow_of] = True
    rate = np.where(active, 0.0, np.inf)
    left = np.asarray(capacity, dtype=float).copy()
    n_links = len(left)
    while flow_of.size:
        load = np.bincount(link_of, weights=wt, minlength=n_links)
        loaded = load > 0
        share = np.full(n_links, np.inf)
        share[loaded] = left[loaded] / load[loaded]
        d = max(share.min(), 0.0)
        rate[active] += d
        left -= d * load
        full = loaded & (share <= d * (1 + 1e-9))
        left[full] = 0.0
        frozen = np.zeros(f_count, dtype=bool)
        frozen[flow_of[full[link_of]]] = True
        active &= ~frozen
        keep = active[flow_of]
        flow_of, link_of, wt = flow_of[keep], link_of[keep], wt[keep]
    return rate
