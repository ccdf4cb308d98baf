"""Errors a user can fix. The CLI prints them as one line and exits with status 2 (no traceback)."""

from __future__ import annotations

__all__ = ["UserError"]


class UserError(Exception):
    """Bad input from the user: a file, a flag, a name. The message is one line and names what is wrong."""
