"""Errors a user can fix, and the one way dpcomm quotes a cause in a one-line message.

The CLI prints a :class:`UserError` as one line and exits with status 2 (no traceback).
"""

from __future__ import annotations

import re

__all__ = ["Interrupted", "UserError", "first_line"]

# gloo prefixes its messages with the C++ source location, e.g. "[/path/gloo/transport/tcp/pair.cc:553] ".
_SOURCE_LOCATION = re.compile(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\] ")
_MAX_CHARS = 300  # a cause quoted in one line of a message


class UserError(Exception):
    """Bad input from the user: a file, a flag, a name. The message is one line and names what is wrong."""


class Interrupted(BaseException):  # noqa: N818 - named for what the user sees
    """A signal (Ctrl-C, SIGTERM) stopped the run. The CLI prints ``dpcomm: interrupted`` and exits with
    ``128 + signum`` (130, 143). A ``BaseException``, as ``KeyboardInterrupt`` is, so that ``except
    Exception`` blocks let it through."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(f"interrupted by signal {self.signum}")


def first_line(exc: BaseException, *, with_type: bool = False) -> str:
    """The readable first line of ``exc``'s message, what a one-line error quotes of a cause.

    Its type name when the message is empty; gloo's source-location prefix and torch's "This is typically ..."
    advice are cut, and at most 300 characters are kept. ``with_type`` prefixes ``TypeName: ``.
    """
    text = (str(exc).strip().splitlines() or [""])[0]
    text = _SOURCE_LOCATION.sub("", " ".join(text.split()))
    cut = text.find(". This is typically")
    text = (text[:cut] if cut > 0 else text)[:_MAX_CHARS]
    if not text:
        return type(exc).__name__
    return f"{type(exc).__name__}: {text}" if with_type else text
