"""Errors a user can fix. The CLI prints them as one line and exits with status 2 (no traceback)."""

from __future__ import annotations

__all__ = ["UserError", "first_line"]


class UserError(Exception):
    """Bad input from the user: a file, a flag, a name. The message is one line and names what is wrong."""


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type name when the message is empty): what a one-line error
    quotes of a cause."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
