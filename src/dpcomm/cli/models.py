"""List the model zoo: input (an image shape, or ``T=1024 tokens``), classes (a decoder's: its vocabulary),
learnable layers and parameters of each network."""

from __future__ import annotations

import argparse
import json

COMMAND = "models"
HELP = "list the model zoo (learnable layers, parameters)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from dpcomm.models import model_info, model_names

    rows = [model_info(name) for name in model_names()]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    table = Table(title="dpcomm model zoo")
    for col, justify in (("model", "left"), ("input", "left"), ("classes", "right"), ("layers", "right")):
        table.add_column(col, justify=justify, no_wrap=True)  # names and numbers whole; the description wraps
    table.add_column("parameters", justify="right", no_wrap=True)
    table.add_column("description")
    for r in rows:
        table.add_row(
            r["name"],
            r["input"],
            str(r["num_classes"]),
            str(r["learnable_layers"]),
            f"{r['params']:,}",
            r["description"],
        )
    Console().print(table)
    return 0
