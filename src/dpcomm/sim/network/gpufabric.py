"""The flow model's links for servers with several accelerators (:class:`dpcomm.topology.MultiGPU`).

Endpoints are GPUs (rank ``r`` = GPU ``r mod G`` of server ``r div G``). Cables, in this order (cable
``c`` gives directed links ``2c`` and ``2c + 1``, as in :mod:`.fabric`):

Every capacity is the line rate times its efficiency (``intra_eff``, ``nic_eff``: the fraction of the line
rate NCCL's protocol moves; ``nic_eff`` defaults to the transport's).

* NVLink (``nvlink=RATE``): cable ``h G + g`` is GPU ``g`` of server ``h`` to its NVSwitch; link ``2c``
  the GPU's send direction, ``2c + 1`` its receive direction, each ``RATE``. A transfer inside a server
  crosses the sender's send link and the receiver's receive link (the switch itself is non-blocking).
* PCIe (``pcie=RATE``): cable ``h`` is server ``h``'s bus; link ``2h`` carries every transfer inside the
  server in either direction (``2h + 1`` is unused): one shared ``RATE``. A loopback bus (``loopback=``,
  the emulated cluster's) is laid out the same, but a transfer between servers does not cross it.
* NICs: cable ``B + h N + n`` is NIC ``n`` of server ``h`` to its switch (``B``: the intra cables above);
  ``2c`` sends, ``2c + 1`` receives, each the NIC rate. With more NICs than GPUs (``N = k G``), the ``k``
  NICs of a GPU are one cable of ``k`` times the rate: NCCL stripes a GPU's channels over its NICs, which
  max-min sharing over one joined link gives exactly, with ``G`` NIC cables per server. The switches
  (rail or one star) are non-blocking, so a transfer between servers crosses the sending NIC's send link
  and the receiving NIC's receive link.

Route between servers (``N`` NICs, ``k = G / N`` GPUs per NIC): the receiving NIC is the destination GPU's
own (``gd div k``); with ``net=rail`` the sending NIC is on the same rail (PXN: if it is not the sender's
own NIC, the data first crosses NVLink to the GPU beside that NIC: sender's send link, that GPU's
receive link), with ``net=star`` it is the sender's own. With PCIe the bus is crossed on both ends.
Routes have at most 4 links.

Switch endpoints (for the schedules whose switches reduce: NVLink SHARP, InfiniBand SHARP), numbered after
the ``P`` GPUs: ``P + h`` is server ``h``'s NVSwitch (a GPU reaches it over its own NVLink send link and
hears from it over its receive link; with PCIe, the bus), ``P + H + n`` the network switch of NIC ``n``'s
rail (reached through NIC ``n`` of the GPU's server, over NVLink to the GPU beside that NIC first when it is
not the GPU's own). A flow between two switch endpoints has no route.

No TCP: InfiniBand and NVLink carry no TCP/IP headers, so a multi-GPU fabric adds no header overhead
(``Goodput(mtu=0)``, :func:`.fabric.make_fabric`); its links carry the line rate times the efficiency (a
``transport=tcp`` fabric's TCP framing is in its fraction).
"""

from __future__ import annotations

import numpy as np

from dpcomm.topology.multigpu import MultiGPU

__all__ = ["build_multigpu"]


def build_multigpu(t: MultiGPU, nic_Bps: float) -> tuple:
    """``(capacity, names, hops, route)`` of ``t`` (:func:`.fabric.make_fabric`'s builder shape);
    ``nic_Bps``: a NIC's bytes/s each way when the spec gives no ``nic=``."""
    g, hosts, nics = t.gpus, t.hosts, t.nic_count
    joined = max(1, nics // g)  # NICs joined into one link per GPU where there are more NICs than GPUs
    nics //= joined
    per = g // nics  # GPUs per NIC link
    # links carry the achievable rate: the line rate times NCCL's fraction of it (the transport's by default)
    nic_c = (t.nic_bps / 8 if t.nic_bps is not None else nic_Bps) * t.nic_fraction * joined
    intra_c = t.intra_bps / 8 * t.intra_eff
    nvlink = t.intra == "nvlink"
    base = hosts * g if nvlink else hosts  # first NIC cable
    if nvlink:
        names = [x for h in range(hosts) for j in range(g) for x in (f"h{h}g{j}>nv", f"nv>h{h}g{j}")]
    else:
        names = [x for h in range(hosts) for x in (f"h{h}bus", f"h{h}bus-")]
    names += [x for h in range(hosts) for n in range(nics) for x in (f"h{h}n{n}>sw", f"sw>h{h}n{n}")]
    cap = np.empty(2 * (base + hosts * nics))
    cap[: 2 * base] = intra_c
    cap[2 * base :] = nic_c
    rail = t.net == "rail"

    ranks = hosts * g
    sw0 = ranks + hosts  # switch endpoints: server h's NVSwitch is ranks + h, rail n's switch sw0 + n

    def between(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Routes between GPUs (the module docstring)."""
        hs, gs = np.divmod(src, g)
        hd, gd = np.divmod(dst, g)
        same = hs == hd
        nd = gd // per  # the receiving NIC: the destination GPU's own
        ns = nd if rail else gs // per
        nic_up = 2 * (base + hs * nics + ns)
        nic_dn = 2 * (base + hd * nics + nd) + 1
        out = np.full((len(src), 4), -1, dtype=np.int64)
        if nvlink:
            relay = ~same & (ns != gs // per)  # PXN: over NVLink to the GPU beside the sending NIC
            out[:, 0] = np.where(same | relay, 2 * src, nic_up)  # NVLink send link, or its own NIC
            out[:, 1] = np.where(same, 2 * dst + 1, np.where(relay, 2 * (hs * g + ns * per) + 1, nic_dn))
            out[:, 2] = np.where(relay, nic_up, -1)
            out[:, 3] = np.where(relay, nic_dn, -1)
        elif t.intra == "loopback":  # the bus carries only transfers inside the server
            out[:, 0] = np.where(same, 2 * hs, nic_up)
            out[:, 1] = np.where(same, -1, nic_dn)
        else:
            out[:, 0] = 2 * hs  # the sender's bus
            out[:, 1] = np.where(same, -1, nic_up)
            out[:, 2] = np.where(same, -1, nic_dn)
            out[:, 3] = np.where(same, -1, 2 * hd)  # the receiver's bus
        return out

    def to_switch(gpu: np.ndarray, sw: np.ndarray, up: bool) -> np.ndarray:
        """Routes from a GPU to a switch endpoint (``up``), or back: its server's NVSwitch is one NVLink
        (or bus) hop; rail ``n``'s switch is NIC ``n`` of the GPU's server, reached over NVLink through the
        GPU beside it when that is not the GPU's own NIC (or over the bus)."""
        h, local = np.divmod(gpu, g)
        out = np.full((len(gpu), 4), -1, dtype=np.int64)
        on_nvs = sw < sw0
        n = np.where(on_nvs, 0, sw - sw0)
        nic = 2 * (base + h * nics + n) + (0 if up else 1)
        own = 2 * gpu + (0 if up else 1)
        if nvlink:
            relay = ~on_nvs & (n != local // per)
            beside = 2 * (h * g + n * per) + (1 if up else 0)
            first = np.where(on_nvs | relay, own, nic)
            second = np.where(on_nvs, -1, np.where(relay, beside, -1))
            third = np.where(relay, nic, -1)
            down = [np.where(relay, nic, first), np.where(relay, beside, second), np.where(relay, own, third)]
            path = [first, second, third] if up else down
        else:
            bus = 2 * h
            path = (
                [bus, np.where(on_nvs, -1, nic)]
                if up
                else [np.where(on_nvs, bus, nic), np.where(on_nvs, -1, bus)]
            )
        for i, col in enumerate(path):
            out[:, i] = col
        return out

    def route(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        if len(src) and max(int(src.max()), int(dst.max())) < ranks:
            return between(src, dst)
        out = np.full((len(src), 4), -1, dtype=np.int64)
        plain = (src < ranks) & (dst < ranks)
        up, down = (src < ranks) & (dst >= ranks), (src >= ranks) & (dst < ranks)
        if plain.any():
            out[plain] = between(src[plain], dst[plain])
        if up.any():
            out[up] = to_switch(src[up], dst[up], True)
        if down.any():
            out[down] = to_switch(dst[down], src[down], False)
        return out

    return cap, names, 4, route, hosts + nics
