"""Per-layer traces: the format (``dpcomm-trace/1``), the profiler and analytic model that make them.

``profile`` and ``analytic_trace`` are imported lazily so that reading a trace does not import torch.
"""

from dpcomm.trace.format import TRACE_FORMAT, Layer, Trace, load_trace, save_trace
from dpcomm.trace.shipped import find_trace, shipped_traces, trace_path

__all__ = [
    "TRACE_FORMAT",
    "Layer",
    "Trace",
    "load_trace",
    "save_trace",
    "find_trace",
    "shipped_traces",
    "trace_path",
    "profile",
    "analytic_trace",
]


def __getattr__(name: str):
    if name == "profile":
        from dpcomm.trace.profiler import profile

        return profile
    if name == "analytic_trace":
        from dpcomm.trace.analytic import analytic_trace

        return analytic_trace
    raise AttributeError(f"module 'dpcomm.trace' has no attribute {name!r}")
