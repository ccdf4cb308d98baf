"""The JSON record of a running testbed: ``/run/dpcomm/testbed/<name>.json``.

``DPCOMM_TESTBED_DIR`` moves the folder.

Written atomically once the cluster is up; ``status``, ``exec``, ``launch`` read it; ``down`` deletes it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dpcomm.errors import UserError
from dpcomm.testbed.names import check_name
from dpcomm.testbed.shell import TestbedError
from dpcomm.utils.io import atomic_write_json, read_json

__all__ = ["state_dir", "state_path", "save_state", "load_state", "saved_names", "remove_state"]


def state_dir() -> Path:
    return Path(os.environ.get("DPCOMM_TESTBED_DIR", "/run/dpcomm/testbed"))


def state_path(name: str) -> Path:
    return state_dir() / f"{check_name(name)}.json"


def save_state(state: dict[str, Any]) -> Path:
    return atomic_write_json(state_path(state["name"]), state)


def load_state(name: str) -> dict[str, Any]:
    path = state_path(name)
    if not path.exists():
        raise TestbedError(f"no testbed named '{name}' is up (no {path}); start one with `dpcomm testbed up`")
    return read_json(path)


def saved_names() -> list[str]:
    d = state_dir()
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("*.json") if _is_name(p.stem))


def _is_name(stem: str) -> bool:
    try:
        return check_name(stem) == stem
    except UserError:
        return False


def remove_state(name: str) -> bool:
    try:
        state_path(name).unlink()
        return True
    except FileNotFoundError:
        return False
