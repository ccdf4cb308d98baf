"""A launch's private scratch folder, and what a launcher killed with ``kill -9`` leaves behind
(:mod:`dpcomm.lifecycle` has the rest of what :func:`dpcomm.launch.launch` adds around torch's agent).

- **One scratch folder**, private (0700) and removed at exit, for the agent's logs and error files (torch
  would leave a ``torchelastic_*`` folder in the temporary directory per run). While the agent runs, the
  launcher's :func:`tempfile.gettempdir` is that folder too (:func:`temp_files_in`): torch's process
  starter names each worker's error file there (``pytorch-errorfile-*.pickle``, which a failed worker
  writes and nobody removes).
- **A killed launcher's folder goes with the next launch.** ``kill -9`` gives the launcher no chance to
  remove its folder (its workers die with it: :mod:`dpcomm.lifecycle`). So the launcher holds an
  ``flock`` on the folder's ``owner.lock`` while it runs (the kernel drops it when the process dies,
  whatever killed it), and the next launch removes every ``dpcomm-run-*`` folder of this user whose lock
  no process holds (:func:`remove_dead_scratch`), as a run removes the temporaries a crashed checkpoint
  write left (:func:`dpcomm.runtime.checkpoint.remove_stale_temporaries`).
- **No "leaked semaphore" warning.** multiprocessing's resource tracker, a helper process the launcher
  starts for the semaphores of the workers' error queues, outlives a killed launcher and removes them;
  it does so without printing its warning on the user's terminal (:func:`quiet_resource_tracker`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["SCRATCH_PREFIX", "quiet_resource_tracker", "remove_dead_scratch", "scratch_dir", "temp_files_in"]

SCRATCH_PREFIX = "dpcomm-run-"
"""Name prefix of a launch's scratch folder in the temporary directory."""
_OWNER = "owner.lock"  # in a scratch folder: flock()ed by its launcher for as long as it lives


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    """A private folder for one launch, removed (with what the agent wrote there) on the way out; the
    folders of launchers that died without removing theirs are removed first (:func:`remove_dead_scratch`).
    """
    remove_dead_scratch()
    path = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    lock = -1
    try:
        # locked before it has its name: a lock file another launch can open is always held until we die
        tmp = path / f".{_OWNER}.tmp"
        lock = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(lock, f"{os.getpid()}\n".encode())  # for a person looking: the launcher's pid
        os.rename(tmp, path / _OWNER)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)  # still locked: no other launch removes it meanwhile
        if lock >= 0:
            os.close(lock)


def remove_dead_scratch(folder: str | os.PathLike | None = None) -> list[Path]:
    """Remove the scratch folders (``dpcomm-run-*``) in ``folder`` (default: the temporary directory) whose
    launcher is gone: this user's, whose ``owner.lock`` no process holds (a launcher killed with ``kill -9``
    has no chance to remove its folder; the kernel releases its lock). A folder without the lock (a launch
    in its first instant, or one of an older dpcomm), another user's, or a link is left alone. Returns the
    folders removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder if folder is not None else tempfile.gettempdir()))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(SCRATCH_PREFIX):
            continue
        try:
            mine = entry.stat(follow_symlinks=False).st_uid == os.getuid()
            if not mine or not entry.is_dir(follow_symlinks=False):
                continue
            fd = os.open(os.path.join(entry.path, _OWNER), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held (BlockingIOError): its launcher runs
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


_TRACKER_QUIET = "ignore:resource_tracker:UserWarning"  # a -W option: that warning's message starts so


def quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker for this process, if none runs yet, without its
    "resource_tracker: There appear to be N leaked semaphore objects to clean up at shutdown" warning.

    The tracker is a helper process the launcher starts for the semaphores of the workers' error queues
    (spawn start method). When the launcher is killed with ``kill -9``, it outlives it, removes the
    semaphores, and printed that warning on the user's terminal after the shell's prompt: it still removes
    them, silently. The tracker takes its ``-W`` options from this process's ``sys.warnoptions`` when it
    starts (``multiprocessing.util._args_from_interpreter_flags``); a tracker already running is left as
    it is."""
    from multiprocessing import resource_tracker

    saved = list(sys.warnoptions)
    sys.warnoptions.append(_TRACKER_QUIET)
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions[:] = saved


@contextlib.contextmanager
def temp_files_in(path: Path) -> Iterator[None]:
    """This process's temporary files go in ``path`` (``tempfile.tempdir``) until the block ends."""
    old = tempfile.tempdir
    tempfile.tempdir = str(path)
    try:
        yield
    finally:
        tempfile.tempdir = old
