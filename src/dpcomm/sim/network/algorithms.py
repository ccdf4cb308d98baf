"""Which schedule each algorithm name means on a fabric, and one call that prices an allreduce.

Names come from :mod:`dpcomm.registry`, the one table ``bench``, ``train --collective``, the DDP hooks and
the cost model read: a name or an alias (``bml`` = ``bcube``) resolves there, and :data:`SCHEDULES` says
which registered algorithms have a flow schedule. ``ring``, ``be``, ``mst``, ``lp``, ``ps``: the
``steps()`` of :mod:`dpcomm.collectives` (the messages the real algorithms send, rank ``i`` on server
``i``), kept without torch in :mod:`dpcomm.schedules`, so pricing them imports no torch. ``native``
(torch.distributed's own allreduce) is scheduled as ``ring``, as the cost model prices it.
``bcube`` (alias ``bml``): BML on BCube, only on a ``bcube:n,k`` fabric (:mod:`.bml`). ``ps-dedicated[:S]``
is not another algorithm but a flow-schedule option of the registry's ``ps``: the parameter server on
``S`` dedicated servers (the last ``S`` servers; default half) and ``P - S`` workers (BML sec. 2's "two
clusters"). ``auto``, ``noop`` and the cost-only formulas have no flow schedule.

On servers of several GPUs (``gpus:``/``dgx-*``) also ``hierarchical`` (:mod:`.hierarchical`) and NCCL's
all-reduce as NCCL runs it (:mod:`.nccl`): ``nccl`` (NCCL's own choice of algorithm, protocol and
channels), ``nccl-ring``, ``nccl-tree``, ``nccl-nvls``, ``nccl-nvlstree``, ``nccl-collnet`` (=
``nccl-collnet-direct``), ``nccl-collnet-chain`` (the algorithm forced, as ``NCCL_ALGO`` does), each with an
optional ``:LL``, ``:LL128`` or ``:Simple`` (``NCCL_PROTO``).

Sizes are bytes of float32 (the element count is ``S // 4``), at most :data:`MAX_BYTES`; busbw is
nccl-tests' ``2 (P-1)/P * S / t``. The work a schedule may hand the flow model is bounded before it is
built (:func:`check_work`): at most :data:`MAX_FLOWS` flows in one step and :data:`MAX_FLOW_STEPS` flows
over all steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import dpcomm.costmodel.collective  # noqa: F401 - fills the registry's cost formulas (ALGORITHMS is checked)
from dpcomm import registry, schedules
from dpcomm.costmodel.network import Network
from dpcomm.errors import UserError
from dpcomm.messages import Step
from dpcomm.sim.network import fit_rows, hierarchical, nccl
from dpcomm.sim.network.bml import bml_steps
from dpcomm.sim.network.engine import FlowModel, FlowRun
from dpcomm.sim.network.fabric import Fabric
from dpcomm.topology import BCube, MultiGPU

__all__ = [
    "ALGORITHMS",
    "MAX_BYTES",
    "MAX_FLOWS",
    "MAX_FLOW_STEPS",
    "SCHEDULES",
    "NetsimRow",
    "bml_steps",
    "check_allreduce",
    "check_work",
    "parse_algorithm",
    "schedule",
    "simulate_allreduce",
]

ELEM = 4  # bytes per element (float32)
MAX_BYTES = 1 << 50
"""Largest allreduce the flow model prices: 1 PiB (beyond it byte counts near int64's range, 8 EiB)."""
MAX_FLOWS = 20_000_000
"""Most flows in one step (a 4,096-server parameter server's step is 16.8 M): about 1 GB of routes."""
MAX_FLOW_STEPS = 200_000_000
"""Most flows over a whole schedule (the sum of its steps' flows): what bounds the memory (~18 bytes a
flow) and time of one simulated allreduce. A ring on 8,192 servers is 134 M; on 16,384, 537 M, refused."""

_STEPS = {
    "ring": schedules.ring_steps,
    "be": schedules.be_steps,
    "mst": schedules.mst_steps,
    "ps": schedules.ps_steps,
    "native": schedules.ring_steps,
}
"""The schedule each name runs (its :mod:`dpcomm.collectives` module's ``steps()``; LP's takes a block)."""
SCHEDULES = ("ring", "be", "mst", "lp", "ps", "bcube", "native")
"""Registered algorithms (canonical names of :mod:`dpcomm.registry`) that have a flow schedule."""
_VARIANTS = {"ps-dedicated": "ps"}  # flow-schedule options of a registered algorithm, and which one
_MULTIGPU = ("hierarchical", *nccl.NAMES)
"""Flow schedules for servers of several GPUs (a ``gpus:``/``dgx-*`` topology), not executing collectives."""
ALGORITHMS = (*SCHEDULES[:-1], "ps-dedicated", *SCHEDULES[-1:], *_MULTIGPU)
"""The names ``dpcomm netsim --algorithms`` lists (aliases such as ``bml`` are accepted too)."""

for _name in (*SCHEDULES, *_VARIANTS.values()):  # one table: every schedule is a registry algorithm
    if registry.entry(_name) is None or registry.resolve(_name) != _name:
        raise RuntimeError(f"flow schedule '{_name}' is not a canonical name in dpcomm.registry")


def _choices() -> str:
    return registry.describe(list(ALGORITHMS))


def parse_algorithm(text: str) -> tuple[str, int | str | None]:
    """``"ps-dedicated:4"`` -> ``("ps-dedicated", 4)``, ``"bml"`` -> ``("bcube", None)``, ``"nccl-ring:ll"``
    -> ``("nccl-ring", "LL")``: the canonical name (through :mod:`dpcomm.registry`) and the option; an
    unknown name is a one-line :class:`UserError`."""
    name, _, arg = str(text).strip().partition(":")
    name = name.strip()
    canonical = name if name in _VARIANTS or name in _MULTIGPU else registry.resolve(name)
    if canonical is None:
        raise UserError(f"unknown algorithm '{name}' for netsim (choose from {_choices()})")
    if canonical not in ALGORITHMS:
        raise UserError(f"algorithm '{name}' has no flow schedule (choose from {_choices()})")
    if not arg:
        return canonical, None
    if canonical in nccl.NAMES:
        return canonical, nccl.parse_protocol(arg)
    if canonical != "ps-dedicated" or not arg.isdigit() or int(arg) < 1:
        raise UserError(
            f"bad algorithm '{text}' (only ps-dedicated:S, S >= 1, and nccl[-ALGO]:LL|LL128|Simple take one)"
        )
    return canonical, int(arg)


def _flows(
    name: str, p: int, arg: int | str | None, blocks: int, cube: BCube | None, gpus: int = 1
) -> tuple[int, int]:
    """``(most flows in one step, flows over all steps)`` of ``name``'s allreduce on ``p`` ranks (upper
    bounds from the algorithms' docstrings), before any of it is built; ``blocks``: LP's block count."""
    if name in ("ring", "native"):
        return p, p * 2 * (p - 1)
    if name in ("be", "mst"):  # at most one message per rank per step, 2 log2 p steps (+ BE's fold)
        return p, p * (4 * max(1, (p - 1).bit_length()) + 4)
    if name == "lp":  # every block crosses the p - 1 links of the chain up, then down
        return 2 * min(blocks, p - 1), 2 * blocks * (p - 1)
    if name == "ps":
        return p * (p - 1), 2 * p * (p - 1)
    if name == "ps-dedicated":
        servers = arg if arg is not None else max(1, p // 2)
        return max(0, p - servers) * servers, 2 * max(0, p - servers) * servers
    if name == "hierarchical":  # one message per rank per step, 2 (G - 1) + 2 (M - 1) <= 2 P steps
        return p, 2 * p * p
    if name == "nccl-ring":  # ``blocks``: the channels, one message each per rank and step
        return blocks * p, 2 * (p - 1) * blocks * p
    if name == "nccl-tree":  # a stage: <= 4 edges x 2 ways per rank, channel and tree; 2 (G + log2 M) stages
        return 16 * blocks * p, 16 * blocks * p * 2 * (gpus + p.bit_length())
    if name in ("nccl-nvls", "nccl-nvlstree") or name.startswith("nccl-collnet"):
        # one step: <= 2 + 4 flows per rank (+ heads); CollNet Chain 2 per rank and channel
        return 6 * p + 2 * blocks * p, 6 * p + 2 * blocks * p
    n, k = (cube.n, cube.k) if cube is not None else (2, 1)
    return k * p * (n - 1), 2 * k * k * p * (n - 1)  # bcube: each server's k threads, n - 1 neighbours


def check_work(algo: str, p: int, *, blocks: int = 1, cube: BCube | None = None, gpus: int = 1) -> None:
    """Refuse, in one line and before anything is built, an allreduce on ``p`` ranks whose flows exceed
    :data:`MAX_FLOWS` in a step or :data:`MAX_FLOW_STEPS` in all (``blocks``: LP's pipeline blocks;
    ``cube``: the BCube that ``bcube`` runs on)."""
    name, arg = parse_algorithm(algo)
    if name == "nccl":  # check_allreduce names the algorithm NCCL picked
        raise ValueError("check_work needs the algorithm nccl picked (check_allreduce finds it)")
    per_step, total = _flows(name, p, arg, blocks, cube, gpus)
    if per_step > MAX_FLOWS:
        raise UserError(f"{algo} on {p} servers is {per_step:,} flows in one step, more than {MAX_FLOWS:,}")
    if total > MAX_FLOW_STEPS:
        raise UserError(
            f"{algo} on {p} servers is {total:,} flows over all its steps, more than {MAX_FLOW_STEPS:,}"
        )


def check_allreduce(
    algo: str,
    fabric: Fabric,
    nbytes: int,
    alpha_s: float,
    block_bytes: int | None = None,
    ranks: int | None = None,
) -> int | None:
    """Every check :func:`schedule` makes, without building anything: the name, the ranks, the size (at
    most :data:`MAX_BYTES`) and the work (:func:`check_work`). Returns LP's block in bytes (else None)."""
    name, arg = parse_algorithm(algo)
    p, numel = fabric.servers if ranks is None else ranks, int(nbytes) // ELEM
    if not 1 <= p <= fabric.servers:
        raise UserError(f"{p} ranks do not fit on the {fabric.servers} servers of {fabric.topology.spec}")
    if name == "ps-dedicated" and (arg if arg is not None else max(1, p // 2)) >= p:
        servers = arg if arg is not None else max(1, p // 2)
        raise UserError(f"ps-dedicated:{servers} needs fewer servers than the {p} in {fabric.topology.spec}")
    if name == "bcube" and not isinstance(fabric.topology, BCube):
        raise UserError(f"{algo} (BML) runs on a bcube:n,k topology, not {fabric.topology.spec}")
    if name == "bcube" and p != fabric.servers:
        raise UserError(
            f"{algo} (BML) needs one rank per server of {fabric.topology.spec} ({fabric.servers}), not {p}"
        )
    if not 0 <= nbytes <= MAX_BYTES:
        raise UserError(f"an allreduce of {nbytes:,} bytes is beyond the flow model's {MAX_BYTES:,} (1 PiB)")
    cube = fabric.topology if isinstance(fabric.topology, BCube) else None
    blocks, gpus, checked = 1, 1, algo
    if name in _MULTIGPU:
        topo = fabric.topology
        if not isinstance(topo, MultiGPU):
            raise UserError(
                f"{algo} runs on servers of several GPUs (gpus:S,G,... or dgx-h100:S), not {topo.spec}"
            )
        if p > topo.gpus and p % topo.gpus:
            raise UserError(f"{algo} needs whole servers: {p} ranks on servers of {topo.gpus} GPUs")
        blocks, gpus = topo.nic_count, topo.gpus  # the channels
        if name in nccl.NAMES:  # what runs: its algorithm and channels bound the flows
            picked = nccl.pick(topo, name, arg, max(int(nbytes), 1), p, fabric.rate_bps)
            blocks = picked.channels
            checked = next(k for k, v in nccl.ALGOS.items() if v == picked.algorithm)
    if name == "lp":  # LP's own default block: the cost model's optimum on this link (<= lp.MAX_BLOCKS)
        beta = 8 / (fabric.rate_bps * fabric.goodput.one_way)  # as the testbed tells lp (link_network)
        net = Network(name=f"{fabric.topology.spec}@{fabric.rate_bps:g}", alpha=alpha_s, beta=beta)
        block_bytes = schedules.lp_block(int(nbytes), p, net, "allreduce", block_bytes)
        blocks = max(1, -(-numel // max(1, block_bytes // ELEM)))  # as lp.steps cuts them
    check_work(checked, p, blocks=blocks, cube=cube, gpus=gpus)
    return block_bytes if name == "lp" else None


def schedule(
    algo: str,
    fabric: Fabric,
    nbytes: int,
    alpha_s: float,
    block_bytes: int | None = None,
    ranks: int | None = None,
) -> list[Step]:
    """The steps of ``algo``'s allreduce of ``nbytes`` bytes on ``ranks`` ranks (default: every server of
    ``fabric``), rank ``i`` on server ``i`` (a partly filled topology fills its first edge switches first).
    :func:`check_allreduce` first: nothing is built beyond the stated limits."""
    block_bytes = check_allreduce(algo, fabric, nbytes, alpha_s, block_bytes, ranks)
    name, arg = parse_algorithm(algo)
    p, numel = fabric.servers if ranks is None else ranks, int(nbytes) // ELEM
    cube = fabric.topology if isinstance(fabric.topology, BCube) else None
    if name == "lp":
        return schedules.lp_steps(p, numel, ELEM, block_bytes=block_bytes)
    if name in _STEPS:
        return _STEPS[name](p, numel, ELEM)
    if name == "hierarchical":  # one ring per rail
        return hierarchical.steps(p, fabric.topology.gpus, numel, ELEM)
    if name in nccl.NAMES:
        topo = fabric.topology
        picked = nccl.pick(topo, name, arg, max(int(nbytes), 1), p, fabric.rate_bps)
        return nccl.steps(topo, picked, p, int(nbytes), fabric.servers)
    if name == "ps-dedicated":
        servers = arg if arg is not None else max(1, p // 2)
        return schedules.ps_dedicated_steps(p - servers, servers, numel, ELEM)
    return bml_steps(cube, numel, ELEM)


def _row_fitted(topo, name: str, arg: int | str | None) -> bool:
    """Whether a calibration's per-size factors (:mod:`.fit_rows`) price ``name`` (with protocol ``arg``) on
    ``topo``: what runs is what they were fitted for (``nccl`` narrowed by ``algo=`` to the fitted
    ``nccl-ring`` counts, as does the protocol ``proto=`` narrows to)."""
    if not isinstance(topo, MultiGPU) or not topo.row_factors or not topo.row_algo:
        return False

    def runs(n: str, proto: str | None) -> tuple[str, str | None]:
        return (f"nccl-{topo.algo}" if n == "nccl" and topo.algo else n), (proto or topo.proto)

    base, _, proto = topo.row_algo.partition(":")
    return runs(name, arg if isinstance(arg, str) else None) == runs(base, proto or None)


@dataclass(frozen=True, slots=True, kw_only=True)
class NetsimRow:
    """One simulated allreduce, in nccl-tests' columns."""

    topology: str
    algorithm: str
    """What ran: the name asked for, or what the topology narrowed it to (``nccl`` on a fabric with
    ``algo=ring``, a calibration's pick, runs ``nccl-ring``)."""
    servers: int
    """Physical servers the ranks occupy (a multi-GPU fabric's hosts; elsewhere one rank per server)."""
    ranks: int
    """Ranks (GPUs on a multi-GPU fabric)."""
    bytes: int
    time_s: float
    algbw_GBps: float
    """``S / t`` in GB/s (1e9 bytes/s)."""
    busbw_GBps: float
    """``2 (P-1)/P * S / t`` in GB/s."""
    steps: int
    ran: str = ""
    """For ``nccl*``: the algorithm, protocol and channels that ran (``nvls_tree/Simple x8``)."""
    asked: str = ""
    """The name asked for where the topology made it run another (else empty)."""

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


def simulate_allreduce(
    model: FlowModel,
    algo: str,
    nbytes: int,
    *,
    block_bytes: int | None = None,
    links: bool = False,
    ranks: int | None = None,
) -> tuple[NetsimRow, FlowRun]:
    """Price ``algo``'s allreduce of ``nbytes`` on ``model``'s fabric (``ranks`` of its servers, default
    all): the table row and the run (for ``nccl*`` names, NCCL's latency for what it runs when
    ``model.nccl``, :func:`.nccl.price`)."""
    fabric = model.fabric
    name, arg = parse_algorithm(algo)
    p = fabric.servers if ranks is None else ranks
    ran = ""
    if name in nccl.NAMES:
        check_allreduce(algo, fabric, nbytes, model.alpha_s, block_bytes, ranks)
        t, steps, picked = nccl.price(model, name, arg, int(nbytes), p)
        label = picked.label
        if _row_fitted(fabric.topology, name, arg):  # a calibration's factors per measured size
            key = (name, arg, p)
            t = fit_rows.correct(
                model, key, int(nbytes), t, fabric.topology.row_factors,
                lambda n: nccl.price(model, name, arg, n, p)[0],
            )  # fmt: skip
            label = f"{label}, row-fitted"
        run = FlowRun(time_s=t, step_s=(t,), labels=(label,), link_bytes=None)
        if links:
            run = FlowRun(time_s=t, step_s=(t,), labels=(label,), link_bytes=model.link_bytes(steps))
        ran = label
    else:
        steps = schedule(algo, fabric, nbytes, model.alpha_s, block_bytes, ranks)
        run = model.run(steps, links=links)
        t = run.time_s
    workers = p - (arg if arg is not None else max(1, p // 2)) if name == "ps-dedicated" else p
    algbw = nbytes / t / 1e9 if t > 0 else 0.0  # one rank: nothing moves, reported as 0 (as JSON allows)
    busbw = algbw * 2 * (workers - 1) / workers if workers > 1 else 0.0
    topo = fabric.topology
    actual = algo
    if isinstance(topo, MultiGPU) and name in nccl.NAMES:  # the file's or spec's algo= and proto= narrow it
        run_name = f"nccl-{topo.algo}" if name == "nccl" and topo.algo else name
        proto = arg or topo.proto
        actual = f"{run_name}:{proto}" if proto else run_name
    row = NetsimRow(
        topology=fabric.topology.spec,
        algorithm=actual,
        asked=algo if actual != algo else "",
        servers=-(-p // topo.gpus) if isinstance(topo, MultiGPU) else p,
        ranks=p,
        bytes=int(nbytes),
        time_s=t,
        algbw_GBps=algbw,
        busbw_GBps=busbw,
        steps=len(steps),
        ran=ran,
    )
    return row, run
