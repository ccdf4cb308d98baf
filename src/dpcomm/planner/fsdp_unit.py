"""FSDP2's fixed cost of a unit per pass, the FSDP model's ``c`` (:mod:`dpcomm.planner.fsdp_model`).

Each ``fully_shard`` unit costs, in forward and again in backward, work that does not grow with its bytes:
its pre- and post-hooks (Python on the thread that runs the model), the all-gather's copy into one flat
buffer and the copy out to the parameters, the reduce-scatter's copy-in and the sharded gradient's copy-out
(kernel launches on a GPU). The model adds ``c`` to every unit's forward and backward time, so a plan of more
units is never free: without it, on a trace whose collectives cost nothing, every split ties and the least
memory (one unit per module) wins, which FSDP2 runs slower.

Defaults, seconds per unit per pass, by where the model trains (``dpcomm plan --fsdp --unit-cost``,
``plan_fsdp(..., unit_s=)`` and ``dpcomm.fsdp.shard(..., unit_s=)`` take another: measure yours with
``benchmarks/fsdp_unit_cost.py``):

``cpu``   :data:`UNIT_S_CPU`, measured by ``benchmarks/fsdp_unit_cost.py`` (one gloo rank, a stack of 16
          ``nn.Linear(64, 64)`` with ``fully_shard`` on the stack and on every layer, the all-gathers
          asynchronous as ``dpcomm.fsdp.shard`` runs them: ``c = (t_16 - t_1) / 15 / 2``) on the 2-core VM
          (x86_64), torch 2.13.0+cpu, quiet (load average 0.9): 187.5, 188.1, 196.4 and 198.1 us in four
          runs, 192 us taken. It is CPU time: beside other jobs it measures more (422 us at load 9.7).
``cuda``  :data:`UNIT_S_CUDA`, from one NVIDIA H200 (torch 2.11.0+cu130, one rank under NCCL,
          ``docs/data/gpu/h200-2026-11-28/README.md`` item 5): a 4-block decoder (d = 128) ran 19-20 ms an
          iteration with ``fully_shard`` per block and the root (5 units) and 28-33 ms with 10 units (each
          block's leaf modules in one call, the rest of the block in another: the same work in 5 more
          units), ``c = (28 - 20) ms / 5 / 2 = 0.8 ms`` (the least the two ranges allow; at most 1.4 ms).
          That model is launch-bound: the GPU waits for the thread. Where the GPU is the bottleneck the
          thread's part is hidden (GPT-2 at batch 8 x 1,024 in fp32: 159.8 ms with 75 units against 158.6
          ms with 13, the same README's item 3), and the model, which adds ``c`` to the compute, prices
          more units dearer than they are there; the planner then keeps fewer units.
"""

from __future__ import annotations

__all__ = ["UNIT_S_CPU", "UNIT_S_CUDA", "unit_s_for"]

UNIT_S_CPU = 192e-6
"""FSDP2's fixed cost of a unit per pass on a CPU (gloo), seconds (module docstring)."""

UNIT_S_CUDA = 0.8e-3
"""FSDP2's fixed cost of a unit per pass on a GPU (NCCL), seconds (module docstring)."""


def unit_s_for(device_type: str) -> float:
    """The default fixed cost of a unit per pass for a device type (``cpu``, ``meta`` as ``cpu``; anything
    else, an accelerator, as ``cuda``), seconds."""
    return UNIT_S_CPU if device_type in ("cpu", "meta") else UNIT_S_CUDA
