"""Process-group helpers shared by the collectives and the parameter server."""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["group_timeout"]


def group_timeout(group: Any = None) -> datetime.timedelta | None:
    """``group``'s own timeout (None: the default group's, e.g. ``init_worker(timeout_s=...)``), for the
    groups made under it: ``torch.distributed.new_group`` without ``timeout=`` gives gloo's default of 30
    minutes, however short the run's own. None where the backend does not say."""
    pg = group if group is not None else dist.group.WORLD
    try:
        return pg._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError):
        return None
