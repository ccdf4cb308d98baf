"""``dpcomm validate``: measure schedules on the emulated cluster and check dpcomm's simulators against them.

- :mod:`~dpcomm.validate.cases`: the cases, plain data (topology, rate, trace, collective, mode,
  schedules);
- :mod:`~dpcomm.validate.run`: :func:`run_case` builds a testbed of its own, launches one
  :mod:`dpcomm.testbed.node` per server (every schedule side by side, compute emulated from the trace),
  always takes the testbed down, and keeps the case's record as JSON (a rerun resumes);
- :mod:`~dpcomm.validate.predict`: each schedule's iteration predicted from the run's own profile by the
  closed form with fitted costs and by the flow model on the testbed's links;
- :mod:`~dpcomm.validate.report`: the table, geomean |error| and worst row, the JSON and the plot.

docs/validate.md has the results and the causes of the misses.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CASES", "Case", "build_report", "predict_case", "run_case", "select"]

_WHERE = {
    "CASES": "dpcomm.validate.cases",
    "Case": "dpcomm.validate.cases",
    "select": "dpcomm.validate.cases",
    "run_case": "dpcomm.validate.run",
    "predict_case": "dpcomm.validate.predict",
    "build_report": "dpcomm.validate.report",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:  # lazy: the CLI's parser imports no torch
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'dpcomm.validate' has no attribute {name!r}")
