"""dpcomm: plan, simulate, measure and run gradient communication for synchronous data-parallel SGD.

Folders by concern, data flowing one way (trace -> cost model -> planner -> plan -> simulate or run):
``trace/`` (format, profiler), ``models/`` (zoo), ``costmodel/`` (alpha-beta costs), ``planner/``
(MG-WFBP and baselines), ``sim/`` (trace-driven simulator), ``collectives/`` (ring, LP, MST, BE, BML, PS),
``runtime/`` (DataParallel: hooks, buckets, BSP modes), ``train/`` (config, replicas, loop, online
planning), ``topology/`` and ``testbed/`` (emulated cluster), ``cli/``.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "profile"]


def __getattr__(name: str):
    # Lazy so that `import dpcomm` stays cheap (no torch import for pure planning work).
    if name == "profile":
        from dpcomm.trace.profiler import profile

        return profile
    if name == "DataParallel":
        from dpcomm.train.online import DataParallel  # the runtime's, plus planner names

        return DataParallel
    raise AttributeError(f"module 'dpcomm' has no attribute {name!r}")
