"""Byte counters of every link, read from the tbf qdiscs (``tc -s -j qdisc show``).

``tx`` of a NIC is what its server sent into the cable (the server-side tbf), ``rx`` what the switch port
sent to it (the switch-side tbf). Bytes count whole frames (Ethernet header included), as tbf meters them.
"""

from __future__ import annotations

import json
from typing import Any

from dpcomm.testbed.shell import run

__all__ = ["qdiscs", "link_counters"]


def qdiscs(netns: str) -> dict[str, dict[str, Any]]:
    """The root tbf of every device in ``netns``: ``{dev: {"rate_bps", "bytes", "drops", ...}}``."""
    out = {}
    for q in json.loads(run(["tc", "-n", netns, "-s", "-j", "qdisc", "show"]) or "[]"):
        if q.get("kind") != "tbf" or not q.get("root"):
            continue
        opts = q.get("options", {})
        out[q["dev"]] = {
            "rate_bps": int(opts.get("rate", 0)) * 8,  # tc's JSON gives bytes/s
            "burst_bytes": int(opts.get("burst", 0)),
            "bytes": int(q.get("bytes", 0)),
            "packets": int(q.get("packets", 0)),
            "drops": int(q.get("drops", 0)),
            "overlimits": int(q.get("overlimits", 0)),
        }
    return out


def link_counters(state: dict[str, Any]) -> dict[tuple[int, int], dict[str, int]]:
    """``{(server, nic): {"tx", "rx", "tx_drops", "rx_drops", "rate_bps"}}`` for every cable."""
    sw = qdiscs(state["switch_netns"])
    out = {}
    for srv in state["servers"]:
        host = qdiscs(srv["netns"])
        for nic in srv["nics"]:
            mine, theirs = host.get(nic["ifname"], {}), sw.get(nic["port"], {})
            out[(srv["server"], nic["nic"])] = {
                "tx": mine.get("bytes", 0),
                "rx": theirs.get("bytes", 0),
                "tx_drops": mine.get("drops", 0),
                "rx_drops": theirs.get("drops", 0),
                "rate_bps": mine.get("rate_bps", 0),
                "rx_rate_bps": theirs.get("rate_bps", 0),
            }
    return out
