"""A BSP parameter server (the iBatch paper's architecture) on torch.distributed point-to-point messages.

- :mod:`~dpcomm.ps.keys`: which piece of which tensor each server holds (a pure function);
- :mod:`~dpcomm.ps.spec`: placement, pull method, push grouping, sparsification (``ps:ibatch,servers=2``);
- :mod:`~dpcomm.ps.node`: the worker's ``push``/``pull``/``wait`` and the server's sum-update-serve loop;
- :mod:`~dpcomm.ps.rank`: one rank of a run (hooks, pull-plan measurement, checkpoint state);
- :mod:`~dpcomm.ps.runner`: ``train_ps`` on this machine; :mod:`~dpcomm.train.ps_replica`: the train layer's kind.

Pull plans come from :mod:`dpcomm.planner.pull`; :mod:`dpcomm.sim.ps` predicts an iteration.
"""

from dpcomm.ps.keys import Key, assign_keys, server_loads
from dpcomm.ps.spec import PsSpec, parse_ps_schedule, parse_sparsify

__all__ = ["Key", "PsSpec", "assign_keys", "parse_ps_schedule", "parse_sparsify", "server_loads"]
