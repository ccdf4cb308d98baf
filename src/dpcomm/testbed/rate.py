"""Change the link rate of a running testbed: ``dpcomm testbed rate --name N --rate 20mbit [--server I]``.

A network whose capacity changes under a running job (another tenant's traffic, a renegotiated link) is what
online re-planning (:mod:`dpcomm.train.replan`) answers; this makes one on the emulated cluster. Both ends of
every cable of the chosen servers (all by default) get ``tc qdisc change ... tbf`` with the new rate, so both
directions carry at most the new rate from the next packet on; established TCP connections stay up.
The queues stay as built; the tbf bucket follows the rate when it was the default (``max(1 ms of rate,
64 KiB)``, :attr:`~dpcomm.testbed.config.TestbedConfig.burst`), else stays as given. The new rate is recorded
in the testbed's state (per server when ``server`` is given).
"""

from __future__ import annotations

from typing import Any

from dpcomm.testbed.config import TestbedConfig, format_rate, tbf_line
from dpcomm.testbed.shell import TestbedError, batch, require
from dpcomm.testbed.state import save_state

__all__ = ["set_rate"]


def _config(state: dict[str, Any], rate_bps: int) -> TestbedConfig:
    """The testbed's tbf settings with ``rate_bps`` (the bucket re-derived if it was the default)."""
    base = dict(name=state["name"], topology=state["topology"], mtu=state["mtu"], queue_ms=state["queue_ms"],
                host_queue_bytes=state["host_queue_bytes"], congestion_control=state["congestion_control"],
                base=state["base"])  # fmt: skip
    was_default = TestbedConfig(**base, rate_bps=state["rate_bps"]).burst == state["burst_bytes"]
    return TestbedConfig(**base, rate_bps=rate_bps, burst_bytes=None if was_default else state["burst_bytes"])


def set_rate(state: dict[str, Any], rate_bps: int, server: int | None = None) -> dict[str, Any]:
    """Set every link of ``server`` (None: of every server) to ``rate_bps`` in both directions; returns the
    updated state (also saved). A bad server index or a testbed that is gone is a one-line error."""
    require()
    servers = state["servers"]
    if server is not None and not 0 <= server < len(servers):
        raise TestbedError(
            f"testbed '{state['name']}' has servers 0..{len(servers) - 1}, not --server {server}"
        )
    cfg = _config(state, rate_bps)
    chosen = servers if server is None else [servers[server]]
    ports = [tbf_line(nic["port"], cfg, host=False, verb="change") for srv in chosen for nic in srv["nics"]]
    batch("tc", state["switch_netns"], ports)
    for srv in chosen:
        batch(
            "tc",
            srv["netns"],
            [tbf_line(nic["ifname"], cfg, host=True, verb="change") for nic in srv["nics"]],
        )
    if server is None:
        state.update(rate_bps=rate_bps, rate=format_rate(rate_bps), burst_bytes=cfg.burst)
        for srv in servers:
            srv.pop("rate_bps", None)
    else:
        servers[server]["rate_bps"] = rate_bps
    save_state(state)
    return state
