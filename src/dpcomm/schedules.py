"""The allreduce schedules of dpcomm's own collectives (``ring``, ``be``, ``mst``, ``lp``, ``ps``) as plain
data, and the index helpers their executing code shares with them; no torch.

Each ``*_steps(p, numel, elem_size)`` returns the messages the algorithm's allreduce sends, grouped into
the steps its module's docstring numbers (:class:`dpcomm.messages.Step`). The executing algorithms in
:mod:`dpcomm.collectives` import the helpers below (``chunk_bounds``, ``block_bounds``, ``fold_rank``,
``tree_children``, ``tree_parent``) and re-export each function here as their module's ``steps``, and
``tests/test_netsim_schedules.py`` runs the real algorithms on gloo processes and compares every send with
these. Here so that the network simulator (``dpcomm netsim``) prices them without importing torch.
"""

from __future__ import annotations

import numpy as np

from dpcomm.costmodel.lp import least_block, lp_optimal_block
from dpcomm.costmodel.network import Network
from dpcomm.messages import Step

__all__ = [
    "be_steps",
    "block_bounds",
    "chunk_bounds",
    "fold_rank",
    "lp_block",
    "lp_steps",
    "mst_round",
    "mst_steps",
    "ps_dedicated_steps",
    "ps_steps",
    "ring_steps",
    "tree_children",
    "tree_parent",
    "unfold_rank",
]


def chunk_bounds(n: int, k: int) -> list[tuple[int, int]]:
    """Cut ``n`` elements into ``k`` pieces, the first ``n % k`` one element longer: ``[(start, stop)]``."""
    if k < 1 or n < 0:
        raise ValueError(f"need n >= 0 and k >= 1, got n={n}, k={k}")
    q, rem = divmod(n, k)
    out, start = [], 0
    for i in range(k):
        stop = start + q + (1 if i < rem else 0)
        out.append((start, stop))
        start = stop
    return out


def block_bounds(n: int, elem_size: int, block_bytes: int) -> list[tuple[int, int]]:
    """Cut ``n`` elements into blocks of ``block_bytes`` bytes (rounded down to whole elements, at least
    one element); the last block may be shorter. ``n == 0`` gives one empty block."""
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be >= 1, got {block_bytes}")
    per = max(1, block_bytes // elem_size)
    if n == 0:
        return [(0, 0)]
    return [(s, min(s + per, n)) for s in range(0, n, per)]


# --- ring ---------------------------------------------------------------------------------------------


def ring_steps(p: int, numel: int, elem_size: int = 4) -> list[Step]:
    """The allreduce's ``2(P-1)`` steps: in reduce-scatter step ``s`` rank ``v`` sends chunk ``v - s`` to
    ``v + 1``, in allgather step ``s`` chunk ``v + 1 - s`` (``ring_reduce_scatter``, ``ring_allgather``
    with ``own=1``; ``segment_bytes`` cuts messages, not bytes, and is not shown)."""
    if p < 2 or numel == 0:
        return []
    size = np.array([b - a for a, b in chunk_bounds(numel, p)], dtype=np.int64) * elem_size
    v = np.arange(p, dtype=np.int64)
    out = [
        Step(label=f"reduce-scatter {s}", src=v, dst=(v + 1) % p, nbytes=size[(v - s) % p])
        for s in range(p - 1)
    ]
    out += [
        Step(label=f"allgather {s}", src=v, dst=(v + 1) % p, nbytes=size[(v + 1 - s) % p])
        for s in range(p - 1)
    ]
    return out


# --- be (recursive halving and doubling with Rabenseifner's fold) --------------------------------------


def fold_rank(v: int, p: int) -> int | None:
    """New rank ``u`` among the ``p' = 2^floor(log2 p)`` ranks after the fold, or None if ``v`` sits out."""
    r = p - (1 << (p.bit_length() - 1))
    if v < 2 * r:
        return None if v % 2 else v // 2
    return v - r


def unfold_rank(u: int, p: int) -> int:
    """The relative rank ``v`` that takes folded rank ``u`` (the inverse of :func:`fold_rank`)."""
    r = p - (1 << (p.bit_length() - 1))
    return 2 * u if u < r else u + r


def be_steps(p: int, numel: int, elem_size: int = 4) -> list[Step]:
    """The allreduce's steps: fold, ``L`` halving steps, ``L`` doubling steps, unfold (as ``be``'s
    ``_Halving`` and ``BidirectionalExchange.allreduce`` walk them, ``root = 0``)."""
    if p < 2 or numel == 0:
        return []
    q = 1 << (p.bit_length() - 1)
    r = p - q
    ends = np.array([0] + [b for _, b in chunk_bounds(numel, q)], dtype=np.int64) * elem_size
    real = np.array([unfold_rank(u, p) for u in range(q)], dtype=np.int64)
    u = np.arange(q, dtype=np.int64)
    whole = np.full(r, numel * elem_size, dtype=np.int64)
    out = []
    if r:
        odd = np.arange(1, 2 * r, 2, dtype=np.int64)
        out.append(Step(label="fold", src=odd, dst=odd - 1, nbytes=whole))
    lo, hi, m = np.zeros(q, dtype=np.int64), np.full(q, q, dtype=np.int64), q >> 1
    while m:  # recursive halving: send the half of [lo, hi) that does not hold u
        mid = lo + m
        up = (u & m) != 0
        glo, ghi = np.where(up, lo, mid), np.where(up, mid, hi)
        out.append(Step(label=f"halving {m}", src=real, dst=real[u ^ m], nbytes=ends[ghi] - ends[glo]))
        lo, hi, m = np.where(up, mid, lo), np.where(up, hi, mid), m >> 1
    m = 1
    while m < q:  # recursive doubling: send the aligned run of m chunks holding u
        mine = u & ~(m - 1)
        out.append(Step(label=f"doubling {m}", src=real, dst=real[u ^ m], nbytes=ends[mine + m] - ends[mine]))
        m <<= 1
    if r:
        even = np.arange(0, 2 * r, 2, dtype=np.int64)
        out.append(Step(label="unfold", src=even, dst=even + 1, nbytes=whole))
    return out


# --- mst (binomial tree) ---------------------------------------------------------------------------------


def _low(v: int, p: int) -> int:
    if v == 0:
        return 1 << max(p - 1, 0).bit_length()  # 2^ceil(log2 p)
    return v & -v


def tree_parent(v: int) -> int:
    """Parent of relative rank ``v > 0`` in the binomial tree rooted at 0."""
    return v - (v & -v)


def tree_children(v: int, p: int) -> list[int]:
    """Children of relative rank ``v`` in the binomial tree on ``p`` ranks, farthest first."""
    out, m = [], _low(v, p) >> 1
    while m:
        if v + m < p:
            out.append(v + m)
        m >>= 1
    return out


def mst_round(m: int, p: int, down: bool) -> int:
    """1-based round of an edge of span ``m``: broadcast sends the largest span first, reduce the smallest."""
    d = max(p - 1, 0).bit_length()
    return d - m.bit_length() + 1 if down else m.bit_length()


def _rounds(p: int, nbytes: int, down: bool, label: str) -> list[Step]:
    """The tree's edges by :func:`mst_round`: (parent, child) for broadcast, (child, parent) for reduce."""
    d = max(p - 1, 0).bit_length()
    edges: list[list[tuple[int, int, int]]] = [[] for _ in range(d)]
    for v in range(p):
        for k in tree_children(v, p):
            edges[mst_round(k - v, p, down) - 1].append((v, k, nbytes) if down else (k, v, nbytes))
    return [Step.of(f"{label} {i + 1}", e) for i, e in enumerate(edges) if e]


def mst_steps(p: int, numel: int, elem_size: int = 4) -> list[Step]:
    """The allreduce's rounds: ``tree_reduce`` to rank 0 (nearest child first, one child per round), then
    ``tree_broadcast`` from it (farthest first); every message is the whole vector."""
    if p < 2 or numel == 0:
        return []
    return _rounds(p, numel * elem_size, False, "reduce") + _rounds(p, numel * elem_size, True, "broadcast")


# --- lp (Linear Pipeline) ----------------------------------------------------------------------------------


def lp_block(nbytes: int, p: int, network: Network, op: str, block_bytes: int | None = None) -> int:
    """LP's block ``b`` in bytes for a message of ``nbytes`` on ``p`` ranks: ``block_bytes`` or the cost
    model's optimum on ``network``, raised where needed so the message is at most
    ``costmodel.lp.MAX_BLOCKS`` blocks (``LinearPipeline.block_size``)."""
    if block_bytes is not None:
        return max(int(block_bytes), int(least_block(nbytes)))
    return max(1, int(lp_optimal_block(max(nbytes, 1), p, network, op)))


def lp_steps(p: int, numel: int, elem_size: int = 4, *, block_bytes: int) -> list[Step]:
    """The allreduce's pipeline stages (``LinearPipeline.allreduce``): in stage ``t`` position ``c < p - 1``
    sends up-block ``t - c`` to ``c + 1`` and position ``c >= 1`` sends down-block ``t - 2p + 2 + c`` to
    ``c - 1`` (the chain's end turns block ``i`` around in stage ``i + p - 1``), for the blocks that exist;
    the blocks are :func:`block_bounds`'."""
    if p < 2 or numel == 0:
        return []
    size = np.array([b - a for a, b in block_bounds(numel, elem_size, block_bytes)], dtype=np.int64)
    size *= elem_size
    nb = len(size)
    c = np.arange(p + 1, dtype=np.int64)
    rev = size[::-1]  # up-block t - c for c = lo..hi is rev[nb - 1 - t + lo : nb - t + hi]
    out = []
    for t in range(nb + 2 * p - 2):
        # the positions that send are two runs: up senders c in [u0, u1), down senders c in [d0, d1)
        u0, u1 = max(0, t - nb + 1), min(p - 1, t + 1)
        d0, d1 = max(1, 2 * p - 2 - t), min(p, 2 * p - 2 - t + nb)
        u1, d1 = max(u0, u1), max(d0, d1)
        up = (c[u0:u1], c[u0 + 1 : u1 + 1], rev[nb - 1 - t + u0 : nb - 1 - t + u1])
        down = (c[d0:d1], c[d0 - 1 : d1 - 1], size[t - 2 * p + 2 + d0 : t - 2 * p + 2 + d1])
        if d1 == d0 or u1 == u0:  # one run (the fill and the drain: most stages): views, no copies
            src, dst, nbytes = up if d1 == d0 else down
        else:
            src, dst, nbytes = (np.concatenate([a, b]) for a, b in zip(up, down, strict=True))
        out.append(Step(label=f"stage {t}", src=src, dst=dst, nbytes=nbytes))
    return out


# --- ps (parameter server, co-located or dedicated) ---------------------------------------------------------


def _all_pairs(p: int) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` of every ordered pair, each rank's peers in the order ``rank + 1, rank + 2, ..``."""
    src = np.repeat(np.arange(p, dtype=np.int64), p - 1)
    dst = (src + np.tile(np.arange(1, p, dtype=np.int64), p)) % p
    return src, dst


def ps_steps(p: int, numel: int, elem_size: int = 4) -> list[Step]:
    """The allreduce's two steps: push (rank ``i`` sends shard ``j`` to each ``j != i``), pull (rank ``j``
    sends its summed shard ``j`` to each ``i != j``); every rank posts its ``p - 1`` messages at once."""
    if p < 2 or numel == 0:
        return []
    shard = np.array([b - a for a, b in chunk_bounds(numel, p)], dtype=np.int64) * elem_size
    src, dst = _all_pairs(p)
    return [
        Step(label="push", src=src, dst=dst, nbytes=shard[dst]),
        Step(label="pull", src=src, dst=dst, nbytes=shard[src]),
    ]


def ps_dedicated_steps(workers: int, servers: int, numel: int, elem_size: int = 4) -> list[Step]:
    """Push and pull with dedicated servers: worker ``i < W`` sends shard ``j`` (of ``S``) to server
    ``W + j``, which sends the sum back to every worker."""
    if workers < 1 or servers < 1 or numel == 0:
        return []
    shard = np.array([b - a for a, b in chunk_bounds(numel, servers)], dtype=np.int64) * elem_size
    w = np.repeat(np.arange(workers, dtype=np.int64), servers)
    j = np.tile(np.arange(servers, dtype=np.int64), workers)
    return [
        Step(label="push", src=w, dst=workers + j, nbytes=shard[j]),
        Step(label="pull", src=workers + j, dst=w, nbytes=shard[j]),
    ]
