"""Traces shipped with dpcomm, in ``dpcomm/data/traces/<model>-<device>-b<batch>.json``.

Measured CPU traces of the whole zoo (``resnet50-cpu-b8``; see ``docs/traces.md`` for how each was made),
measured H100 traces of five of its models (``resnet50-h100-b32``), and analytic K80 traces of the two
networks of the MG-WFBP reproduction (``googlenet-k80-b64``, ``resnet50-k80-b32``, device ``analytic:k80``;
see :mod:`dpcomm.trace.analytic`).
"""

from __future__ import annotations

from pathlib import Path

from dpcomm.errors import UserError
from dpcomm.trace.format import Trace, load_trace

__all__ = ["TRACES_DIR", "shipped_traces", "trace_path", "find_trace"]

TRACES_DIR = Path(__file__).resolve().parents[1] / "data" / "traces"
"""Folder of the shipped trace files."""


def shipped_traces() -> dict[str, Path]:
    """``{"resnet50-cpu-b8": path, ...}``, sorted by name."""
    if not TRACES_DIR.is_dir():
        return {}
    return {p.stem: p for p in sorted(TRACES_DIR.glob("*.json"))}


def _split(stem: str) -> tuple[str, str, int]:
    model, device, batch = stem.rsplit("-", 2)
    return model, device, int(batch.removeprefix("b"))


def trace_path(model: str, device: str = "cpu", batch_size: int | None = None) -> Path:
    """The shipped trace of zoo ``model`` on ``device`` (``cpu``, ``k80``), at ``batch_size`` if given.

    Several batch sizes: the smallest. None shipped: a one-line :class:`UserError` listing what is.
    """
    found = sorted(
        (_split(stem)[2], path)
        for stem, path in shipped_traces().items()
        if _split(stem)[:2] == (model, device) and batch_size in (None, _split(stem)[2])
    )
    if not found:
        want = f"{model} on {device}" + (f" at batch size {batch_size}" if batch_size else "")
        raise UserError(f"no shipped trace of {want}; shipped: {', '.join(shipped_traces()) or 'none'}")
    return found[0][1]


def find_trace(spec: str) -> Trace:
    """Load a shipped trace by file stem (``googlenet-k80-b64``) or by zoo model name (its CPU trace)."""
    traces = shipped_traces()
    if spec in traces:
        return load_trace(traces[spec])
    try:
        return load_trace(trace_path(spec))
    except UserError:
        raise UserError(
            f"{spec}: no such trace file or shipped trace; shipped: {', '.join(traces) or 'none'}"
        ) from None
