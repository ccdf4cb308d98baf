"""Per-layer traces: the format (``dpcomm-trace/1``), the profiler and analytic model that make them."""

from dpcomm.trace.format import TRACE_FORMAT, Layer, Trace, load_trace, save_trace

__all__ = ["TRACE_FORMAT", "Layer", "Trace", "load_trace", "save_trace"]
