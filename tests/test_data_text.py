"""The ``text`` data kind (the standard library's source as bytes) and token batches of ``synthetic``: shapes,
the one-byte shift, determinism in (seed, epoch, iteration, rank), the held-out split. No processes; ~1 s."""

import sysconfig
from pathlib import Path

import pytest
import torch

from dpcomm.errors import UserError
from dpcomm.runtime.data import DATA_KINDS, TEXT_BUDGET, TextCorpus, TrainData, load_text_corpus

T = 64


def _text(rank: int = 0, *, world: int = 2, seed: int = 3, batch: int = 8, **kw) -> TrainData:
    args = {"input_shape": (T,), "num_classes": 256, "batch_size": batch, "world_size": world, "rank": rank,
            "seed": seed, "vocab": 256, "per_token": True, **kw}  # fmt: skip
    return TrainData("text", **args)


def test_corpus_is_the_sorted_stdlib_sources_cut_at_the_budget():
    corpus = load_text_corpus()
    assert "text" in DATA_KINDS
    assert len(corpus.train) + len(corpus.test) == TEXT_BUDGET  # every CPython has more than 2 MiB of .py
    assert len(corpus.test) == round(TEXT_BUDGET * 0.1)
    first = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"), key=lambda p: p.name)[0]
    head = first.read_bytes()[:1000]
    assert bytes(corpus.train[: len(head)].tolist()) == head
    assert load_text_corpus() is corpus and len(corpus.sha256) == 64  # read once per process


def test_batches_are_windows_shifted_by_one_byte():
    data = _text()
    x, y = data.batch(0)
    assert x.shape == y.shape == (8, T) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
    train = load_text_corpus().train
    for row, window in zip(x, data.indices(0), strict=True):
        assert torch.equal(row, train[window * T : window * T + T].long())
    assert int(x.max()) < 256 and int(x.min()) >= 0


def test_order_is_a_function_of_seed_epoch_iteration_and_rank():
    ranks = [_text(r) for r in range(2)]
    bpe = ranks[0].batches_per_epoch
    assert bpe == (TextCorpus.windows(load_text_corpus().train, T) // 2) // 8
    epoch = [i for d in ranks for it in (0, 1, bpe - 1) for i in d.indices(it)]
    assert len(epoch) == len(set(epoch))  # ranks and iterations never share a window within an epoch
    again = _text(1)
    for it in (bpe + 3, 5, 2 * bpe):  # out of order, across epochs: same batch as a fresh reader
        assert all(torch.equal(a, b) for a, b in zip(again.batch(it), ranks[1].batch(it), strict=True))
    assert ranks[0].indices(0) != ranks[0].indices(bpe)  # reshuffled next epoch
    assert _text(0, seed=4).indices(0) != ranks[0].indices(0)


def test_held_out_windows_are_the_tail_and_never_trained_on():
    data = _text()
    test = load_text_corpus().test
    batches = list(data.test_batches(100))
    assert sum(len(x) for x, _ in batches) == TextCorpus.windows(test, T)
    x, y = batches[0]
    assert x.shape == (100, T) and torch.equal(x[0], test[:T].long()) and torch.equal(x[:, 1:], y[:, :-1])


def test_text_needs_a_decoder_and_a_batch_that_fits():
    with pytest.raises(UserError, match="decoder"):
        TrainData("text", input_shape=(3, 32, 32), num_classes=10, batch_size=4, world_size=1, rank=0, seed=0)
    with pytest.raises(UserError, match="decoder"):  # BERT: tokens in, one label per sequence out
        _text(vocab=30522, per_token=False, num_classes=128)
    with pytest.raises(UserError, match="256 byte tokens"):
        _text(num_classes=100, vocab=100)
    with pytest.raises(UserError, match="smaller --batch-size"):
        _text(batch=10**6)
    with pytest.raises(UserError, match="image model"):  # and digits refuses token models
        TrainData("digits", input_shape=(T,), num_classes=256, batch_size=4, world_size=1, rank=0, seed=0,
                  vocab=256, per_token=True)  # fmt: skip


def test_synthetic_token_batches():
    def synth(per_token: bool, classes: int) -> TrainData:
        return TrainData("synthetic", input_shape=(T,), num_classes=classes, batch_size=4, world_size=2,
                         rank=1, seed=0, vocab=1000, per_token=per_token)  # fmt: skip

    x, y = synth(True, 1000).batch(7)
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (4, T) and int(x.max()) < 1000
    assert torch.equal(x, synth(True, 1000).batch(7)[0]) and not torch.equal(x, synth(True, 1000).batch(8)[0])
    x, y = synth(False, 128).batch(7)  # a sequence classifier (BERT): one label per sample
    assert x.shape == (4, T) and y.shape == (4,) and int(y.max()) < 128
    plain = TrainData("synthetic", input_shape=(3, 8, 8), num_classes=10, batch_size=2, world_size=1, rank=0,
                      seed=0)  # fmt: skip
    assert plain.batch(0)[0].dtype == torch.float32 and plain.batches_per_epoch is None
