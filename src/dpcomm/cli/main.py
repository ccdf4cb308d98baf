"""``dpcomm`` entry point. Sub-commands are the modules of this package that define ``COMMAND``.

Each command module defines::

    COMMAND = "plan"                     # the sub-command's name
    HELP = "one line for --help"
    def add_arguments(parser): ...       # argparse arguments
    def run(args) -> int: ...            # returns the exit status

A :class:`dpcomm.errors.UserError` (bad input) is printed as ``dpcomm: error: <message>`` on one line and
exits with status 2, without a traceback. argparse's own errors (a missing value, a bad ``type=``, an unknown
flag or command) are the same one line, with a hint ``(see dpcomm CMD --help)`` instead of argparse's
usage block: every parser here is a :class:`CommandParser`. Ctrl-C and SIGTERM print
``dpcomm: interrupted`` and exit with 130 and 143 (128 + the signal), also while workers run
(:mod:`dpcomm.lifecycle` stops them).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import signal
import sys
import threading

from dpcomm.errors import Interrupted, UserError

__all__ = ["CommandParser", "build_parser", "command_parser", "main"]


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one-line :class:`UserError` s naming where help is (its
    sub-parsers, made by ``add_subparsers``, are of this class too)."""

    def error(self, message: str):  # argparse calls it for every bad command line
        if message.endswith("expected one argument"):  # `--sizes -1M`: argparse read -1M as a flag
            message += ", or a value that starts with '-' (give it as --flag=VALUE)"
        raise UserError(f"{message} (see {self.prog} --help)")


def _commands() -> list:
    import dpcomm.cli as pkg

    mods = []
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("_") or info.name == "main":
            continue
        mod = importlib.import_module(f"dpcomm.cli.{info.name}")
        if hasattr(mod, "COMMAND"):
            mods.append(mod)
    return sorted(mods, key=lambda m: m.COMMAND)


def command_parser(name: str) -> argparse.ArgumentParser | None:
    """The parser of sub-command ``name`` alone (None if there is no such command)."""
    for mod in _commands():
        if mod.COMMAND == name:
            p = CommandParser(prog=f"dpcomm {name}")
            mod.add_arguments(p)
            return p
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="dpcomm",
        description="Plan, simulate, measure and run gradient communication for data-parallel training.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in _commands():
        p = sub.add_parser(mod.COMMAND, help=mod.HELP, description=getattr(mod, "__doc__", None))
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def _terminated(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    args, extra = build_parser().parse_known_args(argv)
    if extra:  # said with the sub-command's help, where the flags it takes are listed
        shown = " ".join(extra)
        shown = shown if len(shown) <= 80 else f"{shown[:77]}..."
        raise UserError(f"unrecognized arguments: {shown} (see dpcomm {args.command} --help)")
    return args


def _fail(exc: UserError) -> int:
    text = str(exc).replace("\n", "\\n")  # one line, whatever the input quoted in it held
    print(f"dpcomm: error: {text}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parse(argv)
    except UserError as exc:
        return _fail(exc)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        return int(args._run(args) or 0)
    except UserError as exc:
        return _fail(exc)
    except KeyboardInterrupt:
        print("dpcomm: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except Interrupted as exc:
        print("dpcomm: interrupted", file=sys.stderr)
        return 128 + exc.signum
    except BrokenPipeError:
        # The reader went away (`dpcomm ... --json | head`): stop quietly, as the shell's own tools do.
        # Point stdout at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
