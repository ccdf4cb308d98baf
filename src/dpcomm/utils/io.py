"""Atomic writes (temporary file in the same folder, fsync, rename) and JSON reads with one-line errors."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from dpcomm.errors import UserError

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_write_json", "read_json"]


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that a reader sees either the old file or the whole new one."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise UserError(f"{path}: cannot write ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
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


def read_json(path: str | os.PathLike) -> Any:
    """Parse a JSON file; a missing file or bad JSON becomes a one-line :class:`UserError` naming the file."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise UserError(f"{path}: not valid JSON ({where}: {exc.msg})") from None
