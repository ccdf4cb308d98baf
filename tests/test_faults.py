"""Faults a run must survive in one piece: a local run listens on loopback only, Ctrl-C and SIGTERM end it
in one line with every worker gone, ``kill -9`` of the launcher takes the workers with it, a killed worker
ends the run, a taken port is one line before any worker starts; ``testbed launch`` workers die with it.

Multi-process cases run the real CLI in a process of its own (a new session, as a terminal's job) with
``TMPDIR`` in the test's folder, so what a run leaves in the temporary directory can be seen; they are
marked slow. Budget: ~75 s on the 2-core VM at load 6 (ten launches of 2-3 workers, most stopped early;
two resumed runs share one), ~5 s for the testbed cases; the in-process cases take a second or less each.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_testbed import _SKIP as _TESTBED_SKIP

_BENCH = [
    "bench",
    "--nproc",
    "2",
    "--algos",
    "ring",
    "--ops",
    "allreduce",
    "--sizes",
    "1M",
    "--iters",
    "5000",
]


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def _tree(pid: int) -> list[int]:
    kids, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _workers(pid: int) -> list[int]:
    return [p for p in _tree(pid) if "spawn_main" in _cmdline(p)]


def _as_a_terminal_job() -> None:
    """SIGINT and SIGQUIT at their default, as in a terminal's job: a test run that is itself a background
    job of a non-interactive shell (``make test &`` in a script) inherits them ignored, and a launcher
    started that way keeps SIGINT ignored (lifecycle's module docstring); a Ctrl-C test then sees nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _start(tmp_path: Path, *argv: str) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "dpcomm", *argv]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=_as_a_terminal_job,
    )


def _ignores_sigint(pid: int) -> bool:
    """Whether process ``pid`` has SIGINT ignored (the ``SigIgn`` mask of /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            mask = next(int(ln.split()[1], 16) for ln in fh if ln.startswith("SigIgn:"))
    except (OSError, StopIteration):
        return False
    return bool(mask & (1 << (signal.SIGINT - 1)))


def _connected(pid: int) -> int:
    """How many of process ``pid``'s sockets are ESTABLISHED TCP connections (its store client and, once
    the process group is up, gloo's pairs), from /proc."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    inodes = set()
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        n += sum(1 for row in rows if row.split()[3] == "01" and row.split()[9] in inodes)
    return n


def _wait_for_workers(
    proc: subprocess.Popen, n: int = 2, settle_s: float = 1.0, sockets: int = 0
) -> list[int]:
    """The first ``n`` workers of ``proc``, once each has ``sockets`` TCP connections up (2: the store's
    and gloo's pair, so a worker killed after this is killed inside the run, not during its set-up)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        found = _workers(proc.pid)
        if len(found) >= n and all(_connected(p) >= sockets for p in found):
            time.sleep(settle_s)
            return found
        time.sleep(0.05)
    out, err = proc.communicate(timeout=30)
    raise AssertionError(f"no {n} workers appeared (exit {proc.returncode}): {err[-2000:]}")


def _gone(pids: list[int], within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _leftovers(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("dpcomm-run-", "torchelastic_")))


def _listening(pids: list[int]) -> list[str]:
    """``host:port`` of every TCP socket in LISTEN state that one of ``pids`` holds (/proc/net/tcp{,6})."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with_target = os.readlink(fd.path)
                if with_target.startswith("socket:["):
                    inodes.add(with_target[8:-1])
        except OSError:
            continue
    out = []
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                f = line.split()
                if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                    continue
                addr_hex, port_hex = f[1].split(":")
                raw = bytes.fromhex(addr_hex)
                # the kernel prints each 32-bit word in host (little-endian) order
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
                out.append(f"{ipaddress.ip_address(raw)}:{int(port_hex, 16)}")
    return out


def _loopback(hostport: str) -> bool:
    ip = ipaddress.ip_address(hostport.rsplit(":", 1)[0])
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


@pytest.mark.slow
def test_a_local_train_listens_on_loopback_only(tmp_path):
    """The c10d store (and gloo) of a local run: what ``ss -ltn`` shows, read from /proc, while it runs."""
    proc = _start(tmp_path, "train", "--nproc", "2", "--iters", "10", "--schedule", "wfbp", "--json")
    seen: set[str] = set()
    while proc.poll() is None:
        seen.update(_listening(_tree(proc.pid)))
        time.sleep(0.05)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    assert seen, "saw no listening socket at all (the run was too short to catch?)"
    assert all(_loopback(s) for s in seen), f"listening beyond loopback: {sorted(seen)}"
    assert _leftovers(tmp_path) == []  # one scratch folder, removed at exit


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "to_group", "status"), [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143)]
)
def test_a_signal_stops_the_run_in_one_line(tmp_path, sig, to_group, status):
    """Ctrl-C (SIGINT to the whole foreground group, as a terminal sends it) or SIGTERM to the launcher."""
    proc = _start(tmp_path, *_BENCH, "--json")
    workers = _wait_for_workers(proc)
    everyone = _tree(proc.pid)
    if to_group:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (status, "dpcomm: interrupted\n")
    assert _gone(everyone, 5.0) == [] and workers
    assert _leftovers(tmp_path) == []


@pytest.mark.slow
def test_ctrl_c_while_workers_start_is_one_line(tmp_path):
    """Ctrl-C while the workers still import torch (a second or more here): no traceback from each of them.
    The launcher ignores SIGINT while it spawns them and takes it back once they run (lifecycle's module
    docstring): the Ctrl-C comes once /proc shows it taken back."""
    argv = [*_BENCH[: _BENCH.index("--iters") + 1], "50000"]  # a run that outlasts the wait below
    proc = _start(tmp_path, *argv, "--json")
    _wait_for_workers(proc, settle_s=0.0)
    deadline = time.monotonic() + 60
    while _ignores_sigint(proc.pid) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    assert not _ignores_sigint(proc.pid), "the launcher never took SIGINT back"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (130, "dpcomm: interrupted\n")


@pytest.mark.slow
def test_kill_9_of_the_launcher_takes_the_workers_and_the_next_run_its_folder(tmp_path):
    """The workers die with the launcher; its scratch folder, which it had no chance to remove, is removed
    by the next launch (its lock is held by no process); multiprocessing's resource tracker, which outlives
    the launcher, removes the semaphores without a "leaked semaphore objects" warning."""
    proc = _start(tmp_path, *_BENCH, "--json")
    workers = _wait_for_workers(proc)
    os.kill(proc.pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=30)  # to EOF: the tracker holds the stderr pipe until it ends
    assert _gone(workers, 5.0) == []
    assert err == ""
    assert len(_leftovers(tmp_path)) == 1  # the dead launcher's folder
    again = _start(tmp_path, *_BENCH[:2], "1", *_BENCH[3:8], "4K", "--iters", "1", "--json")
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err[-2000:]
    assert _leftovers(tmp_path) == []


@pytest.mark.slow
def test_kill_9_of_a_worker_ends_the_run_in_one_line(tmp_path):
    proc = _start(tmp_path, *_BENCH, "--json")
    workers = _wait_for_workers(proc, sockets=2)  # killed during the set-up, the peer's gloo says so too
    os.kill(workers[-1], signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dpcomm: error: ") and "SIGKILL" in lines[0], err
    assert _gone(workers, 5.0) == [] and _leftovers(tmp_path) == []


def test_a_failed_worker_says_nothing_more_on_stderr():
    """Once a worker's function has raised, its reason travels in torch's error record; what the process
    writes to fd 2 afterwards (gloo's socket thread aborting after a lost peer: 8 lines once, above the
    one-line error) goes nowhere. Before that, stderr is the worker's own."""
    code = (
        "import os\n"
        "from dpcomm.lifecycle import worker_entry\n"
        "def fn():\n"
        "    os.write(2, b'before\\n')\n"
        "    raise RuntimeError('lost peer')\n"
        "try:\n"
        "    worker_entry(fn)\n"
        "except RuntimeError:\n"
        "    os.write(2, b'terminate called after throwing an instance of gloo::IoException\\n')\n"
        "    print('raised')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "raised\n", "before\n")


def test_a_port_in_use_is_one_line_before_any_worker(capsys, monkeypatch):
    """Another run's store (here: any listener) on --master-port: one line, no worker, no table header.
    (Before: the run joined the other store and died with a 95-line error.)"""
    import dpcomm.launch
    from dpcomm.cli.main import main

    monkeypatch.setattr(dpcomm.launch, "launch", lambda *a, **k: pytest.fail("workers were started"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        rc = main([*_BENCH, "--master-port", str(port)])
    assert (rc, capsys.readouterr().err) == (2, f"dpcomm: error: port {port} is in use\n")


# ---------------------------------------------------------------------------------------------------------
# testbed launch: workers run in network namespaces, each in a session of its own


@pytest.fixture
def testbed(tmp_path, monkeypatch):
    if _TESTBED_SKIP:  # the testbed tests' own probe: root, iproute2, a namespace can be made
        pytest.skip(_TESTBED_SKIP)
    from dpcomm.testbed import TestbedConfig, build

    monkeypatch.setenv("DPCOMM_TESTBED_DIR", str(tmp_path / "state"))
    name = f"h6{os.getpid() % 100000}"
    build.down(name)
    build.up(TestbedConfig(name=name, topology="star:2", rate_bps=1_000_000_000))
    yield name
    build.down(name)


def _netns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.mark.testbed
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_testbed_launch_workers_die_with_it(testbed, tmp_path, sig):
    """Before: each worker had its own session and outlived a stopped ``testbed launch`` (the next launch
    then failed with EADDRINUSE)."""
    from dpcomm.testbed import names

    sleeper = ["python", "-c", "import time; time.sleep(120)", "{node_rank}"]
    proc = _start(
        tmp_path, "testbed", "launch", "--name", testbed, "--out-dir", str(tmp_path / "o"), "--", *sleeper
    )
    spaces = [names.host_ns(testbed, s) for s in (0, 1)]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(_netns_pids(ns) for ns in spaces):
        time.sleep(0.05)
    workers = [p for ns in spaces for p in _netns_pids(ns)]
    assert len(workers) == 2, "the launch never started its workers"
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=30)
    if sig == signal.SIGTERM:
        assert (proc.returncode, err) == (143, "dpcomm: interrupted\n")
    assert _gone(workers, 5.0) == []
    assert all(_netns_pids(ns) == [] for ns in spaces)


# ---------------------------------------------------------------------------------------------------------
# checkpoints: a crashed write, an existing checkpoint, the plan that was kept


_CRASH_IN_WRITE = """
import os, sys, torch
import dpcomm.utils.io as io
from dpcomm.runtime.checkpoint import save_checkpoint
save_checkpoint(sys.argv[1], {"iteration": 1, "w": torch.zeros(4)})
io.os.replace = lambda *a: os._exit(9)  # die after the temporary file is written, before the rename
save_checkpoint(sys.argv[1], {"iteration": 2, "w": torch.ones(1 << 16)})
"""


@pytest.mark.slow  # a Python subprocess that crashes mid-write: a process, so not the fast tier
def test_a_crash_during_a_checkpoint_write_keeps_the_last_one_and_the_next_run_cleans_up(tmp_path):
    from dpcomm.runtime.checkpoint import load_checkpoint
    from dpcomm.train import TrainConfig
    from dpcomm.train.checks import check

    ckpt = tmp_path / "ckpt"
    crashed = subprocess.run([sys.executable, "-c", _CRASH_IN_WRITE, str(ckpt)], capture_output=True)
    assert crashed.returncode == 9
    assert load_checkpoint(ckpt)["iteration"] == 1  # the last complete checkpoint
    assert [p.name.endswith(".tmp") for p in ckpt.iterdir()].count(True) == 1  # what the crash left
    check(TrainConfig(nproc=1, iters=5, checkpoint=str(ckpt), overwrite=True))  # the next run, before workers
    assert sorted(p.name for p in ckpt.iterdir()) == ["checkpoint.pt"]


def test_an_existing_checkpoint_is_not_started_over_unasked(tmp_path, capsys, monkeypatch):
    """Even a corrupt one: without --resume or --overwrite it is one line and exit 2, and stays as it was."""
    import dpcomm.launch
    from dpcomm.cli.main import main

    monkeypatch.setattr(dpcomm.launch, "launch", lambda *a, **k: pytest.fail("workers were started"))
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    assert main(["train", "--iters", "2", "--checkpoint", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists: continue it with --resume" in err
    assert (tmp_path / "checkpoint.pt").read_bytes() == b"not a checkpoint"
    assert main(["train", "--iters", "2", "--checkpoint", str(tmp_path), "--resume", "--overwrite"]) == 2


@pytest.mark.slow
def test_a_train_interrupted_by_sigterm_keeps_its_last_checkpoint(tmp_path):
    from dpcomm.runtime.checkpoint import load_checkpoint

    ckpt = tmp_path / "ckpt"
    argv = ["train", "--nproc", "2", "--iters", "100000", "--schedule", "wfbp", "--profile-iters", "1"]
    proc = _start(tmp_path, *argv, "--checkpoint", str(ckpt), "--checkpoint-every", "1", "--json")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (ckpt / "checkpoint.pt").exists():
        time.sleep(0.05)
    workers = _workers(proc.pid)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (143, "dpcomm: interrupted\n")
    assert workers and _gone(workers, 5.0) == []
    assert load_checkpoint(ckpt)["iteration"] >= 1  # whole and readable (writes are atomic)
    assert _leftovers(tmp_path) == []


@pytest.mark.slow
def test_resume_keeps_the_plan_that_was_kept_with_mgwfbp(tmp_path):
    """mgwfbp picks its plan from timings, so two fresh runs may differ on P = 3. A periodic checkpoint waits
    until the plan is kept and carries it; a resumed run uses it (no profiling) and is then a function of
    the checkpoint alone: two resumes of one checkpoint agree bit for bit (run one after the other in one
    launch: a run that timed its plans again would still see other timings)."""
    import shutil as sh

    from dpcomm.launch import WorkerFailure
    from dpcomm.runtime.checkpoint import load_checkpoint
    from dpcomm.train import TrainConfig, train
    from tests._train_workers import train_runs

    def cfg(ckpt: Path, **kw) -> TrainConfig:
        base = {"model": "lenet5", "batch_size": 4, "schedule": "mgwfbp", "nproc": 3, "iters": 8}
        base |= {"profile_iters": 2, "verify_iters": 1, "checkpoint": str(ckpt), "checkpoint_every": 1}
        return TrainConfig(**(base | {"timeout_s": 30, "progress": False} | kw))

    os.environ["DPCOMM_TEST_KILL"] = "1:2"  # dies while the plan is still being made
    try:
        with pytest.raises(WorkerFailure):
            train(cfg(tmp_path / "early", nproc=2))
        os.environ["DPCOMM_TEST_KILL"] = "1:6"  # dies after it was kept
        with pytest.raises(WorkerFailure):
            train(cfg(tmp_path / "late"))
    finally:
        del os.environ["DPCOMM_TEST_KILL"]
    early = load_checkpoint(tmp_path / "early")
    assert early is None, f"a checkpoint without the kept plan: iteration {early['iteration']}"
    state = load_checkpoint(tmp_path / "late")
    # the plan is kept after iteration 4; rank 1 dies at the start of iteration 6, and whether rank 0 still
    # completes iteration 5 is a race (rank 1's last sends of it may or may not be through): 5 or 6
    assert state["iteration"] in (5, 6) and state["plan"] is not None
    sh.copytree(tmp_path / "late", tmp_path / "again")
    (one,), (two,) = train_runs([(cfg(tmp_path / d, resume=True), None) for d in ("late", "again")])
    assert one.start_iteration == two.start_iteration == state["iteration"]
    assert one.plan == two.plan == state["plan"]
    assert not any("measured t_f" in line or "timing" in line for line in one.log)  # no planning again
    assert len(set(one.params_sha256)) == 1 and one.params_sha256 == two.params_sha256
    assert one.loss_final == two.loss_final
