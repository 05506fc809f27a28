"""`tracr bench NAME`: benchmarks of the test-bed's own overhead."""

from __future__ import annotations

import argparse
import importlib
import json

from app_api.bench import BENCHMARKS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure how much tracr perturbs what it measures")
    names = p.add_subparsers(dest="bench", metavar="NAME")
    for name, text in BENCHMARKS.items():
        bp = names.add_parser(name, help=text)
        bp.add_argument("--json", action="store_true", help="print the result as JSON")
        module = importlib.import_module(f"app_api.bench.{name}")
        if hasattr(module, "add_arguments"):
            module.add_arguments(bp)
        bp.set_defaults(func=cmd_run, bench_name=name)
    p.set_defaults(func=lambda args: p.print_help())


def cmd_run(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"app_api.bench.{args.bench_name}")
    result = module.run(args)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        _print_table(args.bench_name, result)
    return int(result.get("exit_code", 0)) if isinstance(result, dict) else 0


def _verdict(result: dict) -> list[str]:
    """The headline: each target with the measured figure and whether it was met."""
    targets, met = result.get("targets") or {}, result.get("met") or {}
    lines = []
    for key, target in targets.items():
        value = result.get(key)
        shown = (", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                           for k, v in value.items()) if isinstance(value, dict)
                 else f"{value:.4g}" if isinstance(value, float) else str(value))
        verdict = {True: "met", False: "MISSED"}.get(met.get(key), "")
        lines.append(f"{key}: {shown} (target {target}) {verdict}".rstrip())
    return lines


def _print_table(name: str, result: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    headline = _verdict(result)
    if headline:  # the answer first; every figure it comes from in the table below
        Console().print("\n".join(escape(line) for line in headline))
    table = Table(title=f"tracr bench {name}")
    table.add_column("key")
    table.add_column("value", justify="right")
    for key, value in _flatten(result):
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    Console().print(table)


def _flatten(d: dict, prefix: str = ""):
    for key, value in d.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
