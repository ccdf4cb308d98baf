"""Flow-level network simulation: collectives as schedules of flows on a topology's real links.

``make_fabric("fattree:16", 10e9)`` builds directed links and routes; :class:`FlowModel` prices a
collective's steps (:mod:`dpcomm.collectives.schedule`) with max-min fair sharing
(:func:`maxmin_rates`), advancing from one flow completion to the next; :func:`simulate_allreduce` gives a
row in nccl-tests' columns. ``dpcomm netsim`` is the command line; docs/netsim.md the validation against
the emulated cluster. Sources: SimGrid's max-min flow model (progressive filling); BML sec. 3 and 5.
"""

from dpcomm.sim.network.algorithms import ALGORITHMS, NetsimRow, bml_steps, schedule, simulate_allreduce
from dpcomm.sim.network.engine import FlowModel, FlowRun
from dpcomm.sim.network.fabric import Fabric, Goodput, LeafSpine, make_fabric, parse_fabric_topology
from dpcomm.sim.network.maxmin import maxmin_rates

__all__ = [
    "ALGORITHMS",
    "Fabric",
    "FlowModel",
    "FlowRun",
    "Goodput",
    "LeafSpine",
    "NetsimRow",
    "bml_steps",
    "make_fabric",
    "maxmin_rates",
    "parse_fabric_topology",
    "schedule",
    "simulate_allreduce",
]
