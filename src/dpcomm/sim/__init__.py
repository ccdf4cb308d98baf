"""Trace-driven simulation of S-SGD iterations under a plan (MG-WFBP Eq. 6-8, 19-21), sweeps over node
counts, and their pictures: Gantt timelines (Fig. 2/4), Chrome traces for Perfetto, scaling plots (Fig. 9).

Plotting modules import matplotlib; import them directly (``dpcomm.sim.timeline``, ``dpcomm.sim.chrome``,
``dpcomm.sim.scaling``) so that plain simulation stays light.
"""

from dpcomm.sim.simulator import CommEvent, ComputeEvent, SimResult, simulate
from dpcomm.sim.sweep import SweepRow, cost_factory, sweep

__all__ = ["CommEvent", "ComputeEvent", "SimResult", "SweepRow", "cost_factory", "simulate", "sweep"]
