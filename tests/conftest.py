"""Session settings for the whole suite.

The fast tier runs on every core through pytest-xdist (``make test-fast``: ``-n auto --dist loadfile``, a
test file's tests stay in one worker so its module fixtures are built once). There each worker process gets
one torch thread: two workers with torch's default of one thread per core would oversubscribe the cores
and spin (measured on the 2-core VM: a GoogLeNet step 2-4x slower while the other worker computes).

Tests marked ``cuda`` (the GPU tier, ``pytest -m cuda``) skip with a reason where CUDA is absent.
"""

import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Skip the ``cuda`` tests, with the reason, where torch sees no CUDA device."""
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: torch.cuda.is_available() is False on this machine")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture
def one_rank():
    """A one-rank gloo group in this process (nothing is spawned), destroyed after the test."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
