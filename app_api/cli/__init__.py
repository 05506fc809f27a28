"""Command groups of the ``tracr`` command.

Each module exposes ``register(subparsers)``. Modules here import at top level
only what loads none of torch, matplotlib, rich or PyYAML, so ``tracr --help``
stays instant; those (the runner, the split engine, the transport, the manifest
parser) are imported inside the command handlers, for start-up time.
Every group module names its handlers ``cmd_<verb>`` (``cmd_ls``, ``cmd_run``, ...).
"""

from __future__ import annotations

import argparse

from app_api.cli import bench, device, experiment, lab, model, results


def build_parser(version: str = "") -> argparse.ArgumentParser:
    """The ``tracr`` parser with every command group registered (no heavy imports); the
    documentation's command reference is generated from it (:mod:`app_api.reference`)."""
    parser = argparse.ArgumentParser(
        prog="tracr",
        description="tracr: a test-bed for split computing (cooperative inference).",
    )
    parser.add_argument("--version", action="version", version=f"tracr {version}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks and debug logs")
    sub = parser.add_subparsers(dest="group", metavar="COMMAND")
    for group in (model, experiment, results, device, lab, bench):
        group.register(sub)
    return parser
