"""The launcher runs real workers through the elastic agent and turns a worker's exception into one line."""

import pytest

from dpcomm.launch import LaunchOptions, WorkerFailure, launch
from tests import _workers


def test_launch_returns_results_by_rank():
    out = launch(_workers.allreduce_rank, 3, 5)
    assert out == [(r, 3, 3.0 * 5) for r in range(3)]  # sum of ranks 0+1+2 = 3, times 5


def test_worker_exception_becomes_one_line():
    with pytest.raises(WorkerFailure) as exc:
        launch(_workers.fail_on_rank, 2, 1)
    assert exc.value.failures.keys() == {1}
    assert "boom on rank 1" in str(exc.value) and "\n" not in str(exc.value)


def test_options_are_validated():
    with pytest.raises(ValueError):
        LaunchOptions(nproc=0)
    with pytest.raises(ValueError):
        LaunchOptions(nproc=1, nnodes=2, node_rank=2, master_port=1234)
