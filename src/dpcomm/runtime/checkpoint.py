"""Training checkpoints: one file, written atomically, checksummed, verified before it replaces the last one.

File layout (``DIR/checkpoint.pt``)::

    b"DPCOMM-CHECKPOINT 1\\n"  <sha256 of payload, 64 hex digits>  b"\\n"  <payload: torch.save(state)>

The payload is read back with ``torch.load(weights_only=True)`` (tensors, numbers, strings, lists, dicts:
no arbitrary objects). A file whose magic, checksum or payload is wrong is *corrupt*: reading it is a
one-line :class:`~dpcomm.errors.UserError`, and nothing here ever writes over it, because a new checkpoint
is checked by the same reader in memory before ``atomic_write_bytes`` (temporary file, fsync, rename)
puts it in place. A reader therefore sees either the previous good checkpoint or the new good one. A crash
during a write can leave only the temporary file, which :func:`remove_stale_temporaries` deletes when
the next run starts.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from dpcomm.errors import UserError, first_line
from dpcomm.utils.io import atomic_write_bytes

__all__ = [
    "CHECKPOINT_NAME",
    "check_writable",
    "checkpoint_path",
    "load_checkpoint",
    "remove_stale_temporaries",
    "save_checkpoint",
]

CHECKPOINT_NAME = "checkpoint.pt"
_MAGIC = b"DPCOMM-CHECKPOINT 1\n"
_DIGEST_LEN = 64  # hex characters of a sha256


def checkpoint_path(directory: str | os.PathLike) -> Path:
    return Path(directory) / CHECKPOINT_NAME


def _encode(state: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    return _MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def _decode(data: bytes, where: Path) -> dict[str, Any]:
    head = len(_MAGIC) + _DIGEST_LEN + 1
    if not data.startswith(_MAGIC) or len(data) < head or data[head - 1 : head] != b"\n":
        raise UserError(f"{where}: corrupt checkpoint (not a dpcomm checkpoint or truncated header)")
    digest, payload = data[len(_MAGIC) : head - 1].decode("ascii", "replace"), data[head:]
    if hashlib.sha256(payload).hexdigest() != digest:
        raise UserError(f"{where}: corrupt checkpoint (checksum mismatch: truncated or modified)")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means the same thing to the user
        raise UserError(f"{where}: corrupt checkpoint (cannot load payload: {first_line(exc)})") from None
    if not isinstance(state, dict) or "iteration" not in state:
        raise UserError(f"{where}: corrupt checkpoint (payload is not a training state)")
    return state


def save_checkpoint(directory: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` (must hold ``iteration``) as ``DIR/checkpoint.pt``; returns the path.

    The encoded bytes are decoded again in memory first, so a state that would not load back is an
    error here and the previous checkpoint stays.
    """
    path = checkpoint_path(directory)
    data = _encode(state)
    _decode(data, path)  # refuse to replace a good checkpoint with one that does not read back
    return atomic_write_bytes(path, data)


def load_checkpoint(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The state saved in ``DIR/checkpoint.pt``; ``None`` if there is none; a corrupt file is a UserError."""
    path = checkpoint_path(directory)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"{path}: cannot read checkpoint ({exc.strerror or exc})") from None
    return _decode(data, path)


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Delete the temporary files a crash during a checkpoint write left in ``directory`` (the atomic
    write's ``.checkpoint.pt.<random>.tmp``); returns them. Called before a run starts, when no write of
    this folder is under way."""
    removed = []
    for tmp in Path(directory).glob(f".{CHECKPOINT_NAME}.*.tmp"):
        try:
            tmp.unlink()
            removed.append(tmp)
        except FileNotFoundError:
            pass
    return removed


def check_writable(directory: str | os.PathLike) -> Path:
    """Create ``directory`` if needed and prove a file can be created in it; else a one-line UserError."""
    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"checkpoint directory {folder} is not a directory")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise UserError(f"checkpoint directory {folder} is not writable ({exc.strerror or exc})") from None
    return folder
