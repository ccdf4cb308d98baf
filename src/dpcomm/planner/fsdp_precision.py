"""Mixed precision in the FSDP prices: FSDP2's ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``.

Under the policy (torch 2.13, ``torch/distributed/fsdp/_fully_shard/_fsdp_param.py`` and
``_fsdp_collectives.py``) a unit's sharded parameters, kept in their own dtype, are cast to ``param_dtype``
before the all-gather, so the gather moves and the unsharded unit holds ``params x bytes(param_dtype)``;
gradients are computed in ``param_dtype`` and cast to ``reduce_dtype`` (default: ``param_dtype``) before
the reduce-scatter, and HSDP's all-reduce across the replicas runs on the reduce-scatter's output, in
``reduce_dtype`` too. So, with ``B`` a unit's full bytes in ``param_dtype`` (the planner's argument,
:mod:`dpcomm.planner.fsdp_model`) and ``k = bytes(reduce_dtype) / bytes(param_dtype)``::

    A = T_ag(B),   R = T_rs(k B),   C = T_ar(k B),   memory B

(bf16 gathers with fp32 reductions: a gather of half the fp32 bytes, a reduction of all of them). The
costs are functions of bytes, so :func:`priced` rescales the reductions' argument; a
:class:`~dpcomm.costmodel.base.LinearCost` stays one (the search's bounds read its slope). Only the
collectives and the memory follow the policy: the units' compute times are the trace's (profile or
retime the trace in the dtype the run computes in).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dpcomm.costmodel.base import CommCost, LinearCost
from dpcomm.errors import UserError

__all__ = ["DTYPE_BYTES", "Precision", "ScaledBytes", "priced", "scaled_bytes"]

DTYPE_BYTES = {
    "fp32": 4,
    "float32": 4,
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "fp64": 8,
    "float64": 8,
}
"""Spellings of the dtypes a policy names, and their bytes per element."""

_CANON = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


def _name(value: Any, what: str) -> str | None:
    if value is None:
        return None
    text = str(value).strip().lower().removeprefix("torch.")
    if text not in DTYPE_BYTES:
        raise UserError(f"{what} must be one of fp32, bf16, fp16, fp64 (or a torch dtype), got {value!r}")
    return _CANON.get(text, text)


@dataclass(frozen=True, slots=True, kw_only=True)
class Precision:
    """FSDP2's mixed-precision policy as the prices need it (names: ``fp32``, ``bf16``, ``fp16``)."""

    param_dtype: str | None = None
    """The dtype units are gathered and computed in (None: the parameters' own)."""
    reduce_dtype: str | None = None
    """The dtype gradients are reduced in (None: ``param_dtype``, as FSDP2 defaults)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "param_dtype", _name(self.param_dtype, "param dtype"))
        object.__setattr__(self, "reduce_dtype", _name(self.reduce_dtype, "reduce dtype"))

    @classmethod
    def of(cls, policy: Any) -> Precision:
        """From a ``MixedPrecisionPolicy`` (or anything with ``param_dtype``/``reduce_dtype``), or None."""
        if policy is None:
            return cls()
        return cls(param_dtype=getattr(policy, "param_dtype", None),
                   reduce_dtype=getattr(policy, "reduce_dtype", None))  # fmt: skip

    @property
    def plain(self) -> bool:
        """No policy: everything in the parameters' own dtype."""
        return self.param_dtype is None and self.reduce_dtype is None

    def gather_bytes(self, stored: int) -> int:
        """Bytes per element gathered (and held unsharded), for parameters stored in ``stored`` bytes."""
        return DTYPE_BYTES[self.param_dtype] if self.param_dtype else int(stored)

    def reduce_bytes(self, stored: int) -> int:
        """Bytes per element of gradient reduced."""
        return DTYPE_BYTES[self.reduce_dtype] if self.reduce_dtype else self.gather_bytes(stored)

    def torch_policy(self) -> Any:
        """The ``torch.distributed.fsdp.MixedPrecisionPolicy`` that runs it (None: none asked)."""
        if self.plain:
            return None
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy

        dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
        return MixedPrecisionPolicy(
            param_dtype=dt[self.param_dtype] if self.param_dtype else None,
            reduce_dtype=dt[self.reduce_dtype] if self.reduce_dtype else None,
        )

    def to_dict(self) -> dict[str, str | None]:
        return {"param_dtype": self.param_dtype, "reduce_dtype": self.reduce_dtype}

    def __str__(self) -> str:
        if self.plain:
            return "the parameters' dtype"
        return f"param_dtype {self.param_dtype or 'as stored'}, reduce_dtype {self.reduce_dtype or 'param'}"


@dataclass(frozen=True, slots=True)
class ScaledBytes:
    """``T(k B)``: a cost whose argument is rescaled (a reduction in another dtype than the gather)."""

    cost: CommCost
    k: float

    def __call__(self, nbytes: float) -> float:
        return float(self.cost(self.k * nbytes))

    def many(self, nbytes: np.ndarray) -> np.ndarray:
        x = self.k * np.asarray(nbytes, dtype=float)
        many = getattr(self.cost, "many", None)
        if callable(many):
            return np.asarray(many(x), dtype=float)
        return np.array([float(self.cost(v)) for v in x.ravel()]).reshape(x.shape)


def scaled_bytes(cost: CommCost | None, k: float) -> CommCost | None:
    """``B -> cost(k B)``; a :class:`LinearCost` stays linear (``a + b k B``), ``k = 1`` is ``cost``."""
    if cost is None or k == 1:
        return cost
    if isinstance(cost, LinearCost):
        return LinearCost(cost.a, cost.b * k)
    return ScaledBytes(cost, float(k))


def priced(
    params: list[int] | np.ndarray, stored: int, precision: Precision | None
) -> tuple[np.ndarray, float]:
    """``(m, k)``: each module's unsharded bytes in ``param_dtype`` and the reductions' byte factor ``k``
    (module docstring), for ``params`` elements per module stored in ``stored`` bytes each."""
    p = precision or Precision()
    if stored < 1 and not p.plain:
        raise UserError("mixed precision needs the parameters' element size (plan a trace, not bare bytes)")
    gather = p.gather_bytes(stored)
    return np.asarray(params, dtype=float) * gather, p.reduce_bytes(stored) / gather
