"""A small decoder trained on the text corpus by every kind of replica in one launch of 3 gloo workers:
dpcomm's runtime with MG-WFBP's plan, DDP with the exact plan, the parameter server with iBatch pulls, and
PyTorch DDP as the reference. Budget: ~20 s on the 2-core VM."""

import math

import pytest

SCHEDULES = ["ddp", "mgwfbp", "ddp:optimal", "ps:ibatch"]


@pytest.mark.slow
def test_a_decoder_trains_on_text_alike_in_every_kind():
    from dpcomm.train import TrainConfig, compare_schedules

    cfg = TrainConfig(model="gpt2-tiny", nproc=3, data="text", iters=8, batch_size=4, progress=False,
                      profile_iters=2, verify_iters=1)  # fmt: skip
    ddp, *others = compare_schedules(cfg, SCHEDULES)
    untrained = math.log(256)  # next-byte loss of a uniform guess over the 256 byte values
    assert ddp.loss_final < untrained - 1.0, ddp.loss_final  # the loss fell
    for r in [ddp, *others]:
        assert len(set(r.params_sha256)) == 1, r.schedule  # replicas bitwise identical
        # the same SGD, gradients summed in another order: float32 rounding only
        assert r.loss_final == pytest.approx(ddp.loss_final, rel=1e-5), r.schedule
