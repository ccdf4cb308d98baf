"""Small shared helpers: atomic file writes and validated JSON reads."""

from dpcomm.utils.io import atomic_write_bytes, atomic_write_json, atomic_write_text, read_json

__all__ = ["atomic_write_bytes", "atomic_write_json", "atomic_write_text", "read_json"]
