"""Collective algorithms built on torch.distributed point-to-point operations, one module each.

Importing the package imports every algorithm module in it (each registers itself with
:func:`~dpcomm.collectives.base.register`), so a new algorithm is added by creating its module. Modules whose
name starts with ``_`` (helpers), ``base`` and the ``dpcomm bench`` driver's modules (``benchmark``,
``bench_fit``, ``memory``) are skipped.
``get(name, **options)`` builds an algorithm; ``resolve(name)`` gives the canonical name of a name or an
alias (``bml`` -> ``bcube``) and ``names()`` lists the canonical names.
"""

from __future__ import annotations

import importlib
import pkgutil

from dpcomm.collectives._p2p import CollectiveError
from dpcomm.collectives.base import OPS, Collective, get, names, register, resolve

__all__ = ["OPS", "Collective", "CollectiveError", "get", "names", "register", "resolve"]


_NOT_ALGORITHMS = ("base", "benchmark", "bench_fit", "memory")


def _import_algorithms() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name in _NOT_ALGORITHMS:
            continue
        importlib.import_module(f"{__name__}.{info.name}")


_import_algorithms()
