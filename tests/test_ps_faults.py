"""The parameter server's failures: a killed worker or server, or a stalled worker, fails the others in one
line within the run's timeout. Four short training runs of 2-3 processes (split from tests/test_ps.py, whose
results-only launch runs beside another file in `make test`; these time out and signal, so they run alone).
"""

import time

import pytest

from dpcomm.launch import WorkerFailure


def _dedicated(pulls: str, timeout: float, servers: int = 1):
    from dpcomm.train import TrainConfig

    # synthetic batches: no scikit-learn import (digits) in the workers, so a run starts sooner and its
    # ranks reach the set-up's first process group together (the server, which takes no data, waited
    # 2.5-2.8 s there for the workers' digits at a load of 10 on the 2-core VM; 0.5-1.0 s without)
    where = f",servers={servers}" if servers else ""
    return TrainConfig(model="lenet5", nproc=2, data="synthetic", iters=6, batch_size=8, timeout_s=timeout,
                       schedule=f"ps:layer{where},pulls={pulls}", progress=False)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("victim", "pulls", "servers"), [(1, "send", 1), (2, "request", 1), (1, "request", 0)]
)
def test_killed_worker_or_server_fails_the_others_in_one_line(monkeypatch, victim, pulls, servers):
    # with one dedicated server, rank 2 is that server (after the two workers): it is named as one
    from dpcomm.train import train

    monkeypatch.setenv("DPCOMM_TEST_KILL", f"{victim}:2")
    timeout = 8.0  # also bounds the set-up's group creation: 5 s failed there on a loaded 2-core machine
    t0 = time.monotonic()
    with pytest.raises(WorkerFailure) as exc:
        train(_dedicated(pulls, timeout, servers))
    elapsed = time.monotonic() - t0
    msg = str(exc.value)
    assert "\n" not in msg and "rank" in msg
    role = "worker" if victim == 1 else "server"
    assert f"{role} rank {victim} failed" in msg, msg  # the rank that died first, by its role
    assert elapsed < 60 + timeout  # start-up of 3 processes, then at most one timeout


@pytest.mark.slow
def test_a_stalled_worker_fails_the_others_within_the_timeout(monkeypatch):
    """Alive but silent: no connection closes, so only the lanes' own timeout (the run's, not
    torch's 30-minute default for new groups) ends the wait on the requests and pushes it owes."""
    from dpcomm.train import train

    monkeypatch.setenv("DPCOMM_TEST_STALL", "1:2")
    # the run waits out the whole timeout. It also bounds the set-up's group creation: 5 s failed there on
    # a loaded 2-core machine with digits data (the workers' scikit-learn import); with synthetic data
    # (_dedicated) the ranks arrive within ~1 s of each other at a load of 10
    timeout = 5.0
    t0 = time.monotonic()
    with pytest.raises(WorkerFailure) as exc:
        train(_dedicated("request", timeout))
    msg = str(exc.value)
    assert "\n" not in msg and "from rank 1" in msg and "timed out" in msg.lower(), msg
    assert time.monotonic() - t0 < 60 + 3 * timeout
