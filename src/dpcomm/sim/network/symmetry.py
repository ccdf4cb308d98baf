"""Shifts of a fabric's servers that map every route onto a route: steps alike up to a shift cost alike.

On a star, a leaf-spine and a fat-tree built by :func:`.fabric.make_fabric`, moving every flow's ``src``
and ``dst`` by a multiple ``o`` of the fabric's *period* ``k`` (one server on a star, a leaf's ``H``
servers on ``leafspine:L,H,R``, a pod's ``(k/2)^2`` on ``fattree:k``) moves every link of every route by
the same ``2o`` (the route formulas of :mod:`.fabric` are linear in the server id within a period), and a
link moved that way has the same capacity. A step and its shifted copy are then the same max-min problem:
the same flows in the same order on links numbered in the same order with the same capacities, so the
flow model (:mod:`.engine`) computes the same rates and times for both, bit for bit, and prices one
representative: the step moved down by the largest multiple of ``k`` that keeps its ids >= 0.

Linear Pipeline's stages are the case in point: between its fill and its turn-around every stage is the
previous one a server further down the chain (``p - b`` of them at ``p`` servers and ``b`` blocks), and so
is every stage between its turn-around and its drain. The flow model's cache keys live here too
(:func:`step_digests`: SHA-256 over a step's arrays, the step moved down first).
"""

from __future__ import annotations

import hashlib

import numpy as np

from dpcomm.messages import Step
from dpcomm.sim.network.fabric import Fabric, LeafSpine
from dpcomm.topology import FatTree, Star

__all__ = ["hasher", "shift_period", "step_digests"]


def _regions(fabric: Fabric) -> tuple[int, list[int]]:
    """``(period, region starts)``: the period in servers and where each kind of link begins (a shift moves
    a link within its kind); ``(0, [])`` for a fabric without one."""
    t, n = fabric.topology, fabric.servers
    if fabric.extra:  # switch endpoints numbered after the servers: not shifted with them
        return 0, []
    if isinstance(t, Star):
        return 1, [0]
    if isinstance(t, LeafSpine):  # cables: server-leaf 0..n-1, leaf-spine n + leaf * H + spine
        return t.per_leaf, [0, 2 * n]
    if isinstance(t, FatTree):  # cables: server-edge, edge-agg from n, agg-core from n + edges * k/2
        h = t.k // 2
        return h * h, [0, 2 * n, 2 * (n + (t.k * t.k // 2) * h)]
    return 0, []


def shift_period(fabric: Fabric) -> int:
    """Servers by which (and by whose multiples) the fabric's steps can be shifted without changing their
    cost, or 0 where none: the topology's period, provided each link moved by twice it (within its kind)
    has the same capacity as before (so a fabric whose capacities were changed by hand gets 0)."""
    k, starts = _regions(fabric)
    if not k:
        return 0
    cap = np.asarray(fabric.capacity)
    bounds = [*starts, len(cap)]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        if b - a > 2 * k and not np.array_equal(cap[a : b - 2 * k], cap[a + 2 * k : b]):
            return 0
    return k


def hasher(*arrays: np.ndarray):
    """SHA-256 over the arrays' lengths and bytes: the caches' keys (a digest, not the bytes, so a cached
    16.8 M-flow step costs 32 bytes of key). Not BLAKE2b: on the 2-core VM (x86_64, SHA extensions) SHA-256
    hashes 1.1 GB/s against BLAKE2b's 0.55, and LP's 11,008 stages at 4,096 servers are 23 M flows."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(memoryview(a).cast("B"))
    return h


def step_digests(step: Step, endpoints: int, period: int) -> tuple[bytes, bytes]:
    """``(step key, rates key)`` of a step the flow model batches: digests of ``(src, dst, bytes, lane)`` and
    of ``(src, dst)`` (as ``src * endpoints + dst``), the step moved down by whole ``period`` s first (0:
    as it is), so steps alike up to such a shift share their keys."""
    pair = step.src * endpoints + step.dst
    if period and len(pair):
        o = min(int(step.src.min()), int(step.dst.min())) // period * period
        if o:
            pair -= o * (endpoints + 1)
    h = hasher(pair)
    rates_key = h.copy().digest()  # the flows' signature, as FlowModel.rates keys it
    lane = step.lane if step.lane is not None else np.zeros(0, dtype=np.int64)
    h.update(b"|")
    for a in (step.nbytes, lane):
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(memoryview(np.ascontiguousarray(a)).cast("B"))
    return h.digest(), rates_key
