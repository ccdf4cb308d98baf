"""``dpcomm`` entry point. Sub-commands are the modules of this package that define ``COMMAND``.

Each command module defines::

    COMMAND = "plan"                     # the sub-command's name
    HELP = "one line for --help"
    def add_arguments(parser): ...       # argparse arguments
    def run(args) -> int: ...            # returns the exit status

A :class:`dpcomm.errors.UserError` (bad input) is printed as ``dpcomm: error: <message>`` on one line and
exits with status 2, without a traceback; argparse's own errors exit with 2 too. Ctrl-C and SIGTERM print
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

__all__ = ["build_parser", "command_parser", "main"]


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
            p = argparse.ArgumentParser(prog=f"dpcomm {name}")
            mod.add_arguments(p)
            return p
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        return int(args._run(args) or 0)
    except UserError as exc:
        text = str(exc).replace("\n", "\\n")  # one line, whatever the input quoted in it held
        print(f"dpcomm: error: {text}", file=sys.stderr)
        return 2
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
