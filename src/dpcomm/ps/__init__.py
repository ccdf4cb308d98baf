"""A BSP parameter server (the iBatch paper's architecture) on torch.distributed point-to-point messages.

- :mod:`~dpcomm.ps.keys`: which piece of which tensor each server holds (a pure function);
- :mod:`~dpcomm.ps.spec`: placement, pull method, push grouping, sparsification (``ps:ibatch,servers=2``);
- :mod:`~dpcomm.ps.layout`: who is who, which slice each message carries, which lane it takes;
- :mod:`~dpcomm.ps.node` (the protocol), :mod:`~dpcomm.ps.worker` (``push``/``pull``/``wait``) and
  :mod:`~dpcomm.ps.server` (sum, update, serve); :mod:`~dpcomm.ps.tags`: every message tag and its range;
- :mod:`~dpcomm.ps.probe` (measurements) and :mod:`~dpcomm.ps.planning` (the pull plan agreed by the ranks);
- :mod:`~dpcomm.ps.rank`: one rank of a run, running a given pull plan; :mod:`~dpcomm.ps.state`: its
  checkpoint state. The training loop runs it as the ``ps`` kind (:mod:`dpcomm.train.ps_replica`), with
  dedicated servers as server ranks.

Pull plans come from :mod:`dpcomm.planner.pull`; :mod:`dpcomm.sim.ps` predicts an iteration.
"""

from dpcomm.ps.keys import Key, assign_keys, server_loads
from dpcomm.ps.spec import PsSpec, parse_ps_schedule, parse_sparsify

__all__ = ["Key", "PsSpec", "assign_keys", "parse_ps_schedule", "parse_sparsify", "server_loads"]
