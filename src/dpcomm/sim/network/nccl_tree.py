"""``nccl-tree``: NCCL's double binary tree across servers, a chain inside each server (a flow schedule:
the messages, not an executing collective).

Symbols: ``P = M G`` ranks on ``M`` servers of ``G`` GPUs; ``C`` channels (default one per NIC), each
carrying ``S/C`` bytes, half on each of its two trees (``S_t = S/(2C)``); ``b`` the pipeline chunk
(:data:`CHUNK` = 512 KiB, NCCL's Simple-protocol step: ``NCCL_BUFFSIZE`` 4 MiB / ``NCCL_STEPS`` 8), ``K =
ceil(S_t / b)`` chunks; ``alpha`` s per pipeline stage; ``d`` the depth of the deeper binary tree.

The trees: the ``M`` servers form NCCL's double binary tree (``ncclGetDtree``: tree 0 is the in-order
binary tree whose node ``r``'s parent is ``(r xor bit) | (bit << 1)`` for ``bit`` the lowest set bit of
``r``, or ``r xor bit`` past the end; tree 1 is its mirror ``M - 1 - r`` for even ``M``, its shift by one
for odd ``M``, so a server that is inner in one tree is a leaf in the other). Inside a server, channel
``c``'s chain runs from its head GPU ``e_c = c G / C`` (beside NIC ``c``) through ``e_c + 1, .., e_c - 1``;
the heads carry the tree edges between servers.

All-reduce, pipelined in chunks: every GPU reduces each chunk up its chain to the head, heads reduce up
the tree to the root, which sends the sum back down the tree and every head down its chain (reduce and
broadcast run at once on different chunks). As steps:
    1. ``2 (G - 1 + d) - 1`` fill stages: every edge of one pipeline (the first channel's first tree)
       carries one chunk (``min(S_t, b)`` bytes) up and one down at once: the pipeline filling and draining
       along its depth ``D = 2 (G - 1 + d)``. The other pipelines fill at the same time through other GPUs
       (each channel's chain starts at another GPU), so a link is not shared by all of them while they
       fill: one pipeline's depth is what the fill costs;
    2. one streaming step: every edge carries its whole ``S_t`` up and down at once (max-min fair rates;
       the slowest edge sets the pace).
Bytes per GPU: a chain GPU sends ``S_t`` up and ``S_t`` down per tree, per channel (``2 S`` in all, like a
ring); a head additionally sends ``S_t`` to its tree parent and to each of its tree children.
Time: ``T = D alpha + (D - 1) b / B + S_t / B`` where ``B`` is the streaming rate of the slowest edge
(``K = 1``: ``D (alpha + S_t / B)``, the unpipelined up-and-down).

Source: NCCL 2.4's double binary trees (S. Jeaugey, "Massively Scale Your Deep Learning Training with NCCL
2.4", NVIDIA blog 2019; P. Sanders, J. Speck, J. L. Traeff, "Two-tree algorithms for full bandwidth
broadcast, reduction and scan", Parallel Computing 2009); tree construction from NCCL
``src/graph/trees.cc`` (github.com/NVIDIA/nccl, commit 18a07eeebe485ae00755615ced44739d20970560).
Simplifications: the pipeline is priced as fill stages plus one streaming step (not chunk by chunk); both
trees of a channel use the same head GPU and NIC; no LL/LL128 protocols, NVLS tree or CollNet.
"""

from __future__ import annotations

import numpy as np

from dpcomm.messages import Step
from dpcomm.sim.network._gpuparts import entry_gpu, parts, shape

__all__ = ["CHUNK", "btree_parent", "dtree_parents", "steps"]

CHUNK = 512 * 1024
"""Pipeline chunk in bytes: NCCL's Simple-protocol step (NCCL_BUFFSIZE 4 MiB / NCCL_STEPS 8)."""


def btree_parent(n: int) -> np.ndarray:
    """NCCL's ``ncclGetBtree`` parents of ranks ``0..n-1`` (-1 for the root, rank 0)."""
    r = np.arange(n, dtype=np.int64)
    bit = r & -r  # lowest set bit (0 for rank 0)
    up = (r ^ bit) | (bit << 1)
    up = np.where(up >= n, r ^ bit, up)
    return np.where(r == 0, -1, up)


def dtree_parents(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(tree 0, tree 1)`` parents of NCCL's double binary tree (``ncclGetDtree``)."""
    t0 = btree_parent(n)
    r = np.arange(n, dtype=np.int64)
    if n % 2:  # shift by one
        u = t0[(r - 1) % n]
        t1 = np.where(u < 0, -1, (u + 1) % n)
    else:  # mirror
        u = t0[n - 1 - r]
        t1 = np.where(u < 0, -1, n - 1 - u)
    return t0, t1


def _depth(parent: np.ndarray) -> int:
    depth, cur = 0, parent.copy()
    while (cur >= 0).any():
        depth += 1
        cur = np.where(cur >= 0, parent[np.maximum(cur, 0)], -1)
    return depth


def _lanes(src: np.ndarray) -> np.ndarray:
    """Every edge is its own pipeline, one alpha per stage: a sender's ``k``-th message is lane ``k``."""
    order = np.argsort(src, kind="stable")
    at = np.searchsorted(src[order], src[order])
    lane = np.empty(len(src), dtype=np.int64)
    lane[order] = np.arange(len(src)) - at
    return lane


def steps(
    p: int, g: int, numel: int, elem_size: int = 4, *, channels: int = 1, chunk_bytes: int = CHUNK
) -> list[Step]:
    """NCCL's tree all-reduce of ``numel`` elements on ``p`` ranks, ``g`` GPUs per server."""
    if channels < 1 or chunk_bytes < 1:
        raise ValueError(f"needs channels >= 1 and chunk_bytes >= 1, got {channels}, {chunk_bytes}")
    g, m = shape(p, g)
    if p == 1:
        return []
    trees = dtree_parents(m)
    hosts = np.arange(m, dtype=np.int64)
    src, dst, full = [], [], []
    for c, n_c in enumerate(parts(numel, channels)):
        e = entry_gpu(c, channels, g)
        chain = hosts[:, None] * g + (e + np.arange(g))[None, :] % g  # (m, g): head first
        head = chain[:, 0]
        for t, n_t in enumerate(parts(n_c, 2)):
            a, b = chain[:, :-1].ravel(), chain[:, 1:].ravel()  # chain edges a - b, a nearer the head
            kid = hosts[trees[t] >= 0]
            up_s = np.concatenate([b, head[kid]])  # reduce: towards the head, then the tree root
            up_d = np.concatenate([a, head[trees[t][kid]]])
            src += [up_s, up_d]  # broadcast: the same edges the other way
            dst += [up_d, up_s]
            full.append(np.full(2 * len(up_s), n_t * elem_size, dtype=np.int64))
    first = 2 * len(src[0])  # the first channel's first tree: its up then its down messages come first
    src_a, dst_a, full_a = np.concatenate(src), np.concatenate(dst), np.concatenate(full)
    depth = 2 * (g - 1 + max(_depth(tr) for tr in trees))
    chunk = np.minimum(full_a[:first], chunk_bytes)
    fill_lane = _lanes(src_a[:first])
    out = [
        Step(label=f"pipeline fill {i}", src=src_a[:first], dst=dst_a[:first], nbytes=chunk, lane=fill_lane)
        for i in range(depth - 1)
    ]
    lane = _lanes(src_a)
    out.append(Step(label="stream", src=src_a, dst=dst_a, nbytes=full_a, lane=lane))
    return out
