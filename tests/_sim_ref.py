"""A tiny reference of MG-WFBP's timing model (Eq. 6-8, 19-21), apart from dpcomm.sim and the planners."""

from __future__ import annotations

from itertools import product

from dpcomm.trace.format import Layer, Trace


def make_trace(backward, forward=None, params=None, dtype_bytes=1) -> Trace:
    """Layers in forward order with the given backward times (s), forward times and parameter counts."""
    n = len(backward)
    forward = forward if forward is not None else [0.0] * n
    params = params if params is not None else [1] * n
    layers = tuple(
        Layer(name=f"l{i}", params=params[i], forward_s=forward[i], backward_s=backward[i]) for i in range(n)
    )
    return Trace(model="hand", batch_size=1, device="test", dtype_bytes=dtype_bytes, layers=layers)


def ref_t_iter(trace: Trace, groups, cost, update_s: float = 0.0) -> float:
    """t_iter in words: R_l = t_f + sum_{j>=l} b_j; a group is ready at its lowest layer's R,
    starts at max(ready, previous end), lasts cost(bytes); t_iter = end of the last one (>= t_f + t_b)."""
    b = [layer.backward_s for layer in trace.layers]
    t_f = sum(layer.forward_s for layer in trace.layers)
    end = 0.0
    for g in groups:
        ready = t_f + sum(b[min(g) :])
        nbytes = sum(trace.layers[l].params for l in g) * trace.dtype_bytes
        end = max(ready, end) + cost(nbytes)
    return max(end, t_f + sum(b)) + update_s


def all_partitions(num_layers: int):
    """Every contiguous partition of layers L-1..0 as groups in communication order (2^(L-1) of them)."""
    for cuts in product((False, True), repeat=num_layers - 1):
        groups, current = [], [num_layers - 1]
        for l, cut in zip(range(num_layers - 2, -1, -1), cuts, strict=True):
            if cut:
                groups.append(tuple(sorted(current)))
                current = []
            current.append(l)
        groups.append(tuple(sorted(current)))
        yield groups
