"""Output files written safely, output paths checked before any work, and JSON reads with one-line errors.

What a write does depends on what the path names now:

- nothing, or a regular file: a temporary file in the same folder, fsync, rename over the path, so a reader
  sees either the old file or the whole new one. A new file gets the permissions the umask gives
  (``0o666 & ~umask``, as ``open(path, "w")`` would); a replaced file keeps its mode (and, where we may,
  its owner);
- a symbolic link: the same, applied to the file it points to (the link stays a link);
- a character or block device or a FIFO (``/dev/null``, ``/dev/stdout``, a named pipe): written in place,
  as ``>`` in a shell would (renaming over a device node would replace it with a regular file);
- a folder: a one-line :class:`UserError`. :func:`check_output_path` says the same before any work starts,
  so a command fails at once rather than after a long run.

A command-line output path (``--plot``, ``--chrome-trace``, ``--fit``, ``-o`` ...) must name a file in a
folder that exists: the commands check it with ``make_folders=False``, so ``--plot /no/such/dir/x.png`` is a
one-line error, not a tree of new folders (a typo in a folder name would otherwise scatter files).
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from dpcomm.errors import UserError

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_json",
    "check_output_path",
    "check_figure_path",
    "read_json",
    "MAX_JSON_BYTES",
]

MAX_JSON_BYTES = 64 << 20
"""Largest JSON file :func:`read_json` reads by default, bytes (64 MiB: a trace of 100,000 layers is ~10 MB;
parsed JSON takes ~10x its size in memory, so a larger file is refused before it is read)."""


def _target(path: Path) -> Path:
    """The file a write to ``path`` lands in: ``path`` itself, or what its chain of links points to."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _stat(path: Path) -> os.stat_result | None:
    """``stat`` through links (``/dev/stdout`` is a link to a pipe that has no path); None: nothing there."""
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _is_special(st: os.stat_result | None) -> bool:
    return st is not None and (
        stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISFIFO(st.st_mode)
    )


def check_output_path(path: str | os.PathLike, *, make_folders: bool = False) -> Path:
    """Refuse, in one line, an output path that no write could use: empty, a folder, a name ending in
    ``/``, a file in a folder that is a file, or one we may not write; with ``make_folders=False`` (the
    command line's rule) also a file whose folder does not exist. Commands call it on every output flag
    before they start work. Returns the path."""
    text = os.fspath(path)
    if not str(text).strip():
        raise UserError("an output path is empty")
    if str(text).endswith(("/", os.sep)):
        raise UserError(f"{text}: names a folder; give a file name")
    p = Path(text)
    st = _stat(p)
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"{text}: is a folder; give a file name")
        if not (stat.S_ISREG(st.st_mode) or _is_special(st)):
            raise UserError(f"{text}: cannot write to it (not a file, device or FIFO)")
        if not os.access(p, os.W_OK):
            raise UserError(f"{text}: not writable")
        if _is_special(st):
            return p
    folder = _target(p).parent
    if not make_folders and not folder.exists():
        raise UserError(f"{text}: no folder {folder} (create it first)")
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # the nearest folder that exists; the write creates the ones below it
    if not folder.is_dir():
        raise UserError(f"{text}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"{text}: cannot create files in {folder}")
    return p


def check_figure_path(path: str | os.PathLike, *, make_folders: bool = False) -> Path:
    """:func:`check_output_path`, and the suffix must be a format matplotlib writes (none: PNG)."""
    p = check_output_path(path, make_folders=make_folders)
    fmt = p.suffix.lstrip(".").lower()
    if fmt:
        from matplotlib.figure import Figure

        known = sorted(Figure().canvas.get_supported_filetypes())
        if fmt not in known:
            raise UserError(f"{path}: cannot draw a '.{fmt}' figure (use one of {', '.join(known)})")
    return p


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` (see the module docstring); returns ``path`` as given."""
    path = Path(path)
    try:
        old = _stat(path)
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise UserError(f"{path}: is a folder; give a file name")
        if _is_special(old):
            with open(path, "wb") as fh:  # a device or FIFO: in place, as a shell's `>` writes
                fh.write(data)
            return path
        target = _target(path)
        folder = target.parent if str(target.parent) else Path(".")
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{target.name}.{secrets.token_hex(4)}.tmp"
        # 0o666 through the umask, as a plain open() creates a file (mkstemp would make it 0o600)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise UserError(f"{path}: cannot write ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            if old is not None:
                os.fchmod(fh.fileno(), stat.S_IMODE(old.st_mode))
                try:
                    os.fchown(fh.fileno(), old.st_uid, old.st_gid)
                except PermissionError:
                    pass  # not ours to give away: the new file is the writer's
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=1) + "\n")


def read_json(path: str | os.PathLike, *, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Parse a JSON file of at most ``max_bytes``; a missing, too large or unreadable file or bad JSON
    becomes a one-line :class:`UserError` naming the file. The size is checked before the file is read."""
    limit = f"{max_bytes:,} bytes ({max_bytes / 2**20:g} MiB)"
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            if stat.S_ISREG(st.st_mode) and st.st_size > max_bytes:
                raise UserError(f"{path}: {st.st_size:,} bytes, more than the {limit} read")
            data = fh.read(max_bytes + 1)  # a pipe or device: read no more than the limit allows
        if len(data) > max_bytes:
            raise UserError(f"{path}: more than the {limit} read")
        text = data.decode()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read ({exc})") from None
    except MemoryError:
        raise UserError(f"{path}: not enough memory to read it") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise UserError(f"{path}: not valid JSON ({where}: {exc.msg})") from None
    except RecursionError:
        raise UserError(f"{path}: JSON nested too deeply to read") from None
    except MemoryError:
        raise UserError(f"{path}: not enough memory to parse it (profile or trace less)") from None
