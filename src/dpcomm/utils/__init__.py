"""Small shared helpers: atomic file writes, validated JSON reads and the one byte-size reader."""

from dpcomm.utils.io import atomic_write_bytes, atomic_write_json, atomic_write_text, read_json
from dpcomm.utils.sizes import parse_size, parse_sizes

__all__ = [
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "parse_size",
    "parse_sizes",
    "read_json",
]
