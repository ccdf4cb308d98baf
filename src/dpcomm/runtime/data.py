"""Training data for ``dpcomm train``: scikit-learn's bundled digits, Python's own source as text, or
synthetic tensors, split per rank.

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
- ``text``: for decoders (input shape ``(T,)``, at least 256 classes): the first ``TEXT_BUDGET`` bytes of
  the sorted top-level ``.py`` files of the running Python's standard library (``sysconfig``'s ``stdlib``
  folder: every machine has it, no download), byte-level tokens (vocabulary 256). The last
  ``_TEXT_TEST_FRACTION`` of the bytes is held out. The training bytes are cut into windows of ``T + 1``
  bytes starting every ``T`` bytes; a sample is ``x = window[:-1]``, ``y = window[1:]`` (next-byte
  targets, ``(B, T)`` int64 each), and windows are shared out per epoch exactly as the digits are. The corpus
  depends on the Python version (3.11's files are not 3.12's): :attr:`TextCorpus.sha256` names it.
- ``synthetic``: random inputs of the model's shape and random labels, drawn from a generator seeded by
  ``(seed, rank, iteration)``; for throughput runs (it has no epochs). Token models (``vocab`` given) get
  int64 ids below ``vocab``, and with ``per_token`` a label per position, ``(B, T)``.

MG-WFBP's Algorithm 2 (line 9) gives worker ``k`` the slice ``(i*bs*N) % n + (k-1)*bs`` of the data at
iteration ``i``; the sampler here is the shuffled equivalent.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data.distributed import DistributedSampler

from dpcomm.errors import UserError

__all__ = [
    "DATA_KINDS",
    "DigitsSplit",
    "TEXT_BUDGET",
    "TEXT_VOCAB",
    "TextCorpus",
    "TrainData",
    "load_digits_split",
    "load_text_corpus",
    "derive_seed",
]

DATA_KINDS = ("synthetic", "digits", "text")
_TEST_FRACTION = 0.2  # share of the 1,797 digits held out for test accuracy
_DIGITS_MAX = 16.0  # load_digits pixel values are integers 0..16
TEXT_BUDGET = 2 * 2**20
"""Bytes of standard-library source in the ``text`` corpus (2 MiB; CPython 3.11's top-level files: 4.7 MB)."""
TEXT_VOCAB = 256
"""Byte-level tokens."""
_TEXT_TEST_FRACTION = 0.1  # the corpus's last 10% of bytes is held out


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


def _digits_arrays() -> tuple[Any, Any]:
    """scikit-learn's digits as ``(images (1797, 8, 8), targets (1797,))`` numpy arrays, read from the file
    it ships (``sklearn/datasets/data/digits.csv.gz``: 64 pixels and the label per row, as ``load_digits``
    reads it) without importing scikit-learn, whose import (~670 modules) cost each worker about a
    CPU-second on the 2-core VM; ``load_digits`` itself where that file is not found."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without running its __init__
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations)), "datasets", "data", "digits.csv.gz")
        if path.is_file():
            import numpy as np

            with gzip.open(path, "rt") as fh:
                data = np.loadtxt(fh, delimiter=",")
            return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images, digits.target


def load_digits_split(seed: int) -> DigitsSplit:
    """scikit-learn's digits, permuted by ``seed`` and split 80/20 into train and test."""
    images, target = _digits_arrays()
    x = torch.tensor(images, dtype=torch.float32) / _DIGITS_MAX
    y = torch.tensor(target, dtype=torch.int64)
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


@dataclass(frozen=True, slots=True, kw_only=True)
class TextCorpus:
    """The ``text`` corpus as bytes, split into a training head and a held-out tail."""

    train: torch.Tensor
    """(n_train,) uint8: the first 90% of the bytes."""
    test: torch.Tensor
    """(n_test,) uint8: the rest."""
    files: int
    """Source files read (the last one possibly cut at the budget)."""
    sha256: str
    """Hash of all the bytes: equal on machines whose runs see the same corpus."""

    def __post_init__(self) -> None:
        if self.train.dtype != torch.uint8 or self.test.dtype != torch.uint8:
            raise ValueError("text corpus: bytes must be uint8 tensors")

    @staticmethod
    def windows(data: torch.Tensor, context: int) -> int:
        """Windows of ``context + 1`` bytes, one starting every ``context`` bytes, in ``data``."""
        return max(0, (len(data) - 1) // context)

    @staticmethod
    def samples(data: torch.Tensor, starts: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)``, each ``(len(starts), context)`` int64: the bytes at ``starts`` and the next ones."""
        chunk = data[starts.unsqueeze(1) + torch.arange(context + 1)].long()
        return chunk[:, :-1], chunk[:, 1:]


@functools.cache
def load_text_corpus(budget: int = TEXT_BUDGET) -> TextCorpus:
    """The first ``budget`` bytes of the standard library's top-level ``.py`` files in name order, read once
    per process."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts, size, files = [], 0, 0
    for path in sorted(stdlib.glob("*.py"), key=lambda p: p.name):
        if size >= budget:
            break
        data = path.read_bytes()[: budget - size]
        parts.append(data)
        size += len(data)
        files += 1
    blob = b"".join(parts)
    if len(blob) < 2**16:
        raise UserError(f"text data: found only {len(blob)} bytes of Python source in {stdlib}")
    corpus = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    n_train = len(blob) - round(len(blob) * _TEXT_TEST_FRACTION)
    return TextCorpus(train=corpus[:n_train], test=corpus[n_train:], files=files,
                      sha256=hashlib.sha256(blob).hexdigest())  # fmt: skip


class TrainData:
    """One rank's batches ``batch(iteration) -> (x, y)``, deterministic in (seed, epoch, iteration).

    ``batches_per_epoch`` is ``None`` for synthetic data (no epochs). ``vocab`` (a token model's input
    vocabulary, :func:`dpcomm.models.input_vocab`) and ``per_token`` (:func:`dpcomm.models.per_token_targets`)
    describe the model; they shape synthetic batches and let ``text`` refuse a model that is not a decoder.
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
        vocab: int | None = None,
        per_token: bool = False,
    ) -> None:
        if kind not in DATA_KINDS:
            raise UserError(f"unknown data {kind!r}; choose one of: {', '.join(DATA_KINDS)}")
        if batch_size < 1:
            raise UserError(f"batch size must be positive, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.kind, self.input_shape, self.num_classes = kind, tuple(input_shape), num_classes
        self.batch_size, self.world_size, self.rank, self.seed = batch_size, world_size, rank, seed
        self.vocab, self.per_token = vocab, per_token
        if per_token and vocab is None:
            raise ValueError("per-token targets need a token model (vocab)")
        self.digits: DigitsSplit | None = None
        self.text: TextCorpus | None = None
        self.batches_per_epoch: int | None = None
        self._epoch_indices: tuple[int, list[int]] | None = None  # (epoch, this rank's sample order)
        items = 0  # samples an epoch shares out: digits, or text windows
        if kind == "digits":
            if len(self.input_shape) != 3 or vocab is not None:
                raise UserError(
                    f"digits data needs an image model (C, H, W input), not input {self.input_shape}"
                )
            if num_classes < 10:
                raise UserError(f"digits has 10 classes; the model has {num_classes} outputs")
            self.digits = load_digits_split(seed)
            items, what = len(self.digits.train_x), "training digits"
        elif kind == "text":
            if len(self.input_shape) != 1 or (vocab is not None and not per_token):
                raise UserError(f"text data trains next-byte prediction: it needs a decoder (input (T,), a "
                                f"target per token), not input {self.input_shape}")  # fmt: skip
            if min(num_classes, vocab or TEXT_VOCAB) < TEXT_VOCAB:
                raise UserError(
                    f"text data has {TEXT_VOCAB} byte tokens; the model has {num_classes} classes"
                )
            self.text = load_text_corpus()
            items, what = TextCorpus.windows(self.text.train, self.input_shape[0]), "text windows"
        if kind != "synthetic":
            self.batches_per_epoch = (items // world_size) // batch_size  # DistributedSampler(drop_last=True)
            if self.batches_per_epoch < 1:
                raise UserError(
                    f"batch size {batch_size} x {world_size} ranks exceeds the {items} {what}; "
                    "use a smaller --batch-size"
                )
        self._items = items

    def epoch_of(self, iteration: int) -> int:
        return 0 if self.batches_per_epoch is None else iteration // self.batches_per_epoch

    def indices(self, iteration: int) -> list[int]:
        """Training-set indices (digits; text: window numbers) of this rank's batch at ``iteration``."""
        assert self.batches_per_epoch is not None, "synthetic data has no indices"
        epoch, step = divmod(iteration, self.batches_per_epoch)
        if self._epoch_indices is None or self._epoch_indices[0] != epoch:
            sampler = DistributedSampler(
                range(self._items),
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
        if self.text is not None:
            context = self.input_shape[0]
            starts = torch.tensor(self.indices(iteration)) * context
            return TextCorpus.samples(self.text.train, starts, context)
        if self.digits is None:
            gen = torch.Generator().manual_seed(derive_seed(self.seed, self.rank, iteration))
            shape = (self.batch_size, *self.input_shape)
            if self.vocab is None:
                x = torch.randn(shape, generator=gen)
            else:
                x = torch.randint(0, self.vocab, shape, generator=gen)
            y = torch.randint(0, self.num_classes, shape if self.per_token else shape[:1], generator=gen)
            return x, y
        idx = torch.tensor(self.indices(iteration))
        return self.digits.resize(self.digits.train_x[idx], self.input_shape), self.digits.train_y[idx]

    def test_batches(self, batch_size: int = 256):
        """The held-out digits (or text windows, in order) as (inputs, labels) batches for the model (digits
        and text only)."""
        if self.text is not None:
            context = self.input_shape[0]
            starts = torch.arange(TextCorpus.windows(self.text.test, context)) * context
            for i in range(0, len(starts), batch_size):
                yield TextCorpus.samples(self.text.test, starts[i : i + batch_size], context)
            return
        assert self.digits is not None
        for i in range(0, len(self.digits.test_x), batch_size):
            x = self.digits.test_x[i : i + batch_size]
            yield self.digits.resize(x, self.input_shape), self.digits.test_y[i : i + batch_size]
