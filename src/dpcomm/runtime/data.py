"""Training data for ``dpcomm train``: scikit-learn's bundled digits, or synthetic tensors, split per rank.

Data order is a pure function of ``(seed, epoch, iteration)`` so that a run resumed from a checkpoint sees
exactly the batches an uninterrupted run would have seen (no sampler state to save):

- ``digits``: the 1,797 8x8 handwritten digits that ship with scikit-learn (``load_digits``, no download),
  split once into train/test by ``seed`` (80/20, a seeded permutation). Each rank's
  share of an epoch is ``torch.utils.data.distributed.DistributedSampler(shuffle=True, seed=seed,
  drop_last=True)`` with ``set_epoch(epoch)``, cut into batches of ``batch_size`` (a last partial batch is
  dropped so every rank runs the same number of iterations). Images are resized bilinearly to the model's
  input shape (``1x28x28`` for LeNet-5, ``3x32x32`` for ResNet-20, channels repeated), at batch time so a
  224x224 model does not hold the whole set at full size, and normalised by the training set's mean and
  standard deviation.
- ``synthetic``: random inputs of the model's shape and random labels, drawn from a generator seeded by
  ``(seed, rank, iteration)``; for throughput runs (it has no epochs).

MG-WFBP's Algorithm 2 (line 9) gives worker ``k`` the slice ``(i*bs*N) % n + (k-1)*bs`` of the data at
iteration ``i``; the sampler here is the shuffled equivalent.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.data.distributed import DistributedSampler

from dpcomm.errors import UserError

__all__ = ["DATA_KINDS", "DigitsSplit", "TrainData", "load_digits_split", "derive_seed"]

DATA_KINDS = ("synthetic", "digits")
_TEST_FRACTION = 0.2  # share of the 1,797 digits held out for test accuracy
_DIGITS_MAX = 16.0  # load_digits pixel values are integers 0..16


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers (``seed, rank, iteration``), stable across runs, processes, platforms."""
    digest = hashlib.sha256(":".join(str(int(p)) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass(frozen=True, slots=True, kw_only=True)
class DigitsSplit:
    """The digits data set at 8x8, split by seed; ``resize`` brings a batch to the model's input shape."""

    train_x: torch.Tensor
    """(n_train, 8, 8) float32 in [0, 1]."""
    train_y: torch.Tensor
    """(n_train,) int64 labels 0..9."""
    test_x: torch.Tensor
    """(n_test, 8, 8) float32 in [0, 1]."""
    test_y: torch.Tensor
    """(n_test,) int64."""
    mean: float
    """Mean pixel of the training images (after scaling to [0, 1])."""
    std: float
    """Standard deviation of the training pixels."""

    def __post_init__(self) -> None:
        if len(self.train_x) != len(self.train_y) or len(self.test_x) != len(self.test_y):
            raise ValueError("digits split: images and labels differ in length")
        if self.std <= 0:
            raise ValueError(f"digits split: std must be positive, got {self.std}")

    def resize(self, images: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """(B, 8, 8) -> (B, C, H, W) for ``shape = (C, H, W)``: bilinear resize, channel repeat, normalise."""
        if len(shape) != 3:
            raise UserError(f"digits data needs an image model (C, H, W input), got input shape {shape}")
        c, h, w = shape
        x = images.unsqueeze(1)
        if (h, w) != tuple(x.shape[-2:]):
            x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)
        x = (x - self.mean) / self.std
        return x.expand(-1, c, -1, -1).contiguous()


def load_digits_split(seed: int) -> DigitsSplit:
    """scikit-learn's digits, permuted by ``seed`` and split 80/20 into train and test."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32) / _DIGITS_MAX
    y = torch.tensor(digits.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(derive_seed(seed, 0xD161)))
    n_test = round(len(x) * _TEST_FRACTION)
    test, train = perm[:n_test], perm[n_test:]
    train_x = x[train]
    return DigitsSplit(
        train_x=train_x,
        train_y=y[train],
        test_x=x[test],
        test_y=y[test],
        mean=float(train_x.mean()),
        std=float(train_x.std()),
    )


class TrainData:
    """One rank's batches ``batch(iteration) -> (x, y)``, deterministic in (seed, epoch, iteration).

    ``batches_per_epoch`` is ``None`` for synthetic data (no epochs).
    """

    def __init__(
        self,
        kind: str,
        *,
        input_shape: tuple[int, ...],
        num_classes: int,
        batch_size: int,
        world_size: int,
        rank: int,
        seed: int,
    ) -> None:
        if kind not in DATA_KINDS:
            raise UserError(f"unknown data {kind!r}; choose one of: {', '.join(DATA_KINDS)}")
        if batch_size < 1:
            raise UserError(f"batch size must be positive, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.kind, self.input_shape, self.num_classes = kind, tuple(input_shape), num_classes
        self.batch_size, self.world_size, self.rank, self.seed = batch_size, world_size, rank, seed
        self.digits: DigitsSplit | None = None
        self.batches_per_epoch: int | None = None
        self._epoch_indices: tuple[int, list[int]] | None = None  # (epoch, this rank's sample order)
        if kind == "digits":
            if num_classes < 10:
                raise UserError(f"digits has 10 classes; the model has {num_classes} outputs")
            self.digits = load_digits_split(seed)
            per_rank = len(self.digits.train_x) // world_size  # DistributedSampler(drop_last=True)
            self.batches_per_epoch = per_rank // batch_size
            if self.batches_per_epoch < 1:
                raise UserError(
                    f"batch size {batch_size} x {world_size} ranks exceeds the {len(self.digits.train_x)} "
                    "training digits; use a smaller --batch-size"
                )

    def epoch_of(self, iteration: int) -> int:
        return 0 if self.batches_per_epoch is None else iteration // self.batches_per_epoch

    def indices(self, iteration: int) -> list[int]:
        """Training-set indices of this rank's batch at ``iteration`` (digits only)."""
        assert self.digits is not None and self.batches_per_epoch is not None
        epoch, step = divmod(iteration, self.batches_per_epoch)
        if self._epoch_indices is None or self._epoch_indices[0] != epoch:
            sampler = DistributedSampler(
                range(len(self.digits.train_x)),
                num_replicas=self.world_size,
                rank=self.rank,
                shuffle=True,
                seed=self.seed,
                drop_last=True,
            )
            sampler.set_epoch(epoch)
            self._epoch_indices = (epoch, list(sampler))
        order = self._epoch_indices[1]
        return order[step * self.batch_size : (step + 1) * self.batch_size]

    def batch(self, iteration: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.digits is None:
            gen = torch.Generator().manual_seed(derive_seed(self.seed, self.rank, iteration))
            x = torch.randn(self.batch_size, *self.input_shape, generator=gen)
            y = torch.randint(0, self.num_classes, (self.batch_size,), generator=gen)
            return x, y
        idx = torch.tensor(self.indices(iteration))
        return self.digits.resize(self.digits.train_x[idx], self.input_shape), self.digits.train_y[idx]

    def test_batches(self, batch_size: int = 256):
        """The held-out digits as (inputs, labels) batches at the model's input shape (digits only)."""
        assert self.digits is not None
        for i in range(0, len(self.digits.test_x), batch_size):
            x = self.digits.test_x[i : i + batch_size]
            yield self.digits.resize(x, self.input_shape), self.digits.test_y[i : i + batch_size]
