"""``dpcomm testbed status``: the testbed's servers, NICs, addresses, link rates and tbf byte counters."""

from __future__ import annotations

from typing import Any

from dpcomm.testbed.config import format_rate
from dpcomm.testbed.counters import link_counters

__all__ = ["status_dict", "print_status"]


def status_dict(state: dict[str, Any]) -> dict[str, Any]:
    """The state plus live counters per cable, JSON-ready."""
    counters = link_counters(state)
    return {
        **state,
        "links": [{"server": s, "nic": l, **c} for (s, l), c in sorted(counters.items())],
    }


def _bytes(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def print_status(state: dict[str, Any], *, counters: bool = True) -> None:
    from rich.console import Console
    from rich.table import Table

    live = link_counters(state) if counters else {}
    title = (
        f"testbed '{state['name']}': {state['topology']}, {len(state['servers'])} servers, "
        f"{state['rate']} per link direction, burst {state['burst_bytes']} B, "
        f"queue {state['queue_ms']:g} ms, host queue {state.get('host_queue', 'fifo')}, "
        f"MTU {state['mtu']}, "
        + (f"{state['cpus']:g} CPUs per server, " if state.get("cpus") is not None else "")
        + (f"{state['gpus']} ranks per server, " if (state.get("gpus") or 1) > 1 else "")
        + (f"loopback {format_rate(state['intra_rate_bps'])}, " if state.get("intra_rate_bps") else "")
        + f"rendezvous {state['master_addr']}"
    )
    table = Table(title=title, title_justify="left")
    for col in ("server", "netns", "NIC", "address", "switch"):
        table.add_column(col)
    if counters:
        for col in ("tx rate", "rx rate", "tx bytes", "rx bytes", "drops tx/rx"):
            table.add_column(col, justify="right")
    for srv in state["servers"]:
        for nic in srv["nics"]:
            row = [str(srv["server"]), srv["netns"], nic["ifname"], nic["address"], nic["bridge"]]
            if counters:
                c = live.get((srv["server"], nic["nic"]), {})
                row += [
                    format_rate(c.get("rate_bps", 0)),
                    format_rate(c.get("rx_rate_bps", 0)),
                    _bytes(c.get("tx", 0)),
                    _bytes(c.get("rx", 0)),
                    f"{c.get('tx_drops', 0)}/{c.get('rx_drops', 0)}",
                ]
            table.add_row(*row)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # a pipe or file: don't squeeze the table into 80 columns
    console.print(table)
