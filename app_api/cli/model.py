"""`tracr model` commands."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="model commands (not yet available)")
    p.set_defaults(func=lambda args: p.print_help())
