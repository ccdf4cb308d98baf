"""Errors a user can fix. The CLI prints them as one line and exits with status 2 (no traceback)."""

from __future__ import annotations

__all__ = ["Interrupted", "UserError", "first_line"]


class UserError(Exception):
    """Bad input from the user: a file, a flag, a name. The message is one line and names what is wrong."""


class Interrupted(BaseException):  # noqa: N818 - named for what the user sees
    """A signal (Ctrl-C, SIGTERM) stopped the run. The CLI prints ``dpcomm: interrupted`` and exits with
    ``128 + signum`` (130, 143). A ``BaseException``, as ``KeyboardInterrupt`` is, so that ``except
    Exception`` blocks let it through."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(f"interrupted by signal {self.signum}")


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type name when the message is empty): what a one-line error
    quotes of a cause."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
