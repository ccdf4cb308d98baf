"""The flags that ``testbed launch`` appends to a worker's command, and the launch options they give."""

from __future__ import annotations

import argparse

from dpcomm.launch import LaunchOptions

__all__ = ["add_node_args", "launch_options"]


def add_node_args(p: argparse.ArgumentParser) -> None:
    """``--nnodes --node-rank --master-addr --master-port`` (set by ``testbed launch``) and ``--nproc``."""
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--node-rank", type=int, required=True)
    p.add_argument("--master-addr", required=True)
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument("--nproc", type=int, default=1)


def launch_options(args: argparse.Namespace) -> LaunchOptions:
    return LaunchOptions.of(args)
