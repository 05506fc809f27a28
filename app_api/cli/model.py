"""`tracr model ls` and `tracr model splits MODEL`: the registry and every cut of a model."""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``model`` command group."""
    p = sub.add_parser("model", help="list models and inspect their split points")
    cmds = p.add_subparsers(dest="model_cmd", metavar="SUBCOMMAND")

    ls = cmds.add_parser("ls", help="list registered models")
    ls.add_argument("pattern", nargs="?", help="fnmatch pattern, e.g. 'resnet*'")
    ls.add_argument(
        "--modes", action="store_true", help="build each model to show its split mode (slow)"
    )
    ls.add_argument("--json", action="store_true", help="print JSON on stdout")
    ls.set_defaults(func=cmd_ls)

    sp = cmds.add_parser("splits", help="every split point of a model, with crossing bytes")
    sp.add_argument("model", help="registered name or torchvision:<name>")
    sp.add_argument(
        "--depth", type=int, default=None, help="module depth of a layer (torchinfo depth)"
    )
    sp.add_argument("--mode", choices=("auto", "graph", "hooks"), default="auto")
    sp.add_argument("--verify", action="store_true", help="check split output == full output")
    sp.add_argument("--json", action="store_true", help="print a JSON array on stdout")
    sp.add_argument("--batch", type=int, default=1)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument(
        "--weights", default=None, help="state_dict file or cached torchvision weights name"
    )
    sp.add_argument("--input-shape", default=None, help="input shape without batch, e.g. 3x64x64")
    sp.add_argument(
        "--tolerance", type=float, default=1e-5, help="max abs diff allowed by --verify"
    )
    sp.set_defaults(func=cmd_splits)
    p.set_defaults(func=lambda args: p.print_help())


def _shape(text: str | None) -> tuple[int, ...] | None:
    from experiment_design.errors import TracrError

    if text is None:
        return None
    try:
        shape = tuple(int(v) for v in text.lower().replace(",", "x").split("x"))
    except ValueError:
        shape = ()
    if not shape or any(v < 1 for v in shape):
        raise TracrError(f"bad input shape '{text}'", hint="write it like 3x224x224 (no batch dim)")
    return shape


def cmd_ls(args: argparse.Namespace) -> int:
    from experiment_design.models import get_model_spec, list_models

    rows = []
    for name in list_models(args.pattern):
        spec = get_model_spec(name)
        row = {
            "name": name,
            "input_shape": list(spec.input_shape),
            "task": spec.task,
            "description": spec.description,
            "mode": _mode_of(name, spec) if args.modes else None,
        }
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title="tracr models (any torchvision classifier also works as torchvision:<name>)"
    )
    for col in ("name", "input", "task", *(["mode"] if args.modes else []), "description"):
        table.add_column(col)
    for r in rows:
        cells = [r["name"], "x".join(map(str, r["input_shape"])), r["task"]]
        if args.modes:
            cells.append(r["mode"])
        table.add_row(*cells, r["description"])
    Console().print(table)
    return 0


def _mode_of(name: str, spec) -> str:
    from experiment_design.errors import TracrError
    from experiment_design.split import build_split_model

    try:
        return build_split_model(name, input_shape=spec.min_input_shape).mode
    except TracrError as exc:
        return f"error: {exc.message}"


def cmd_splits(args: argparse.Namespace) -> int:
    from experiment_design.errors import TracrError
    from experiment_design.split import build_split_model

    if args.batch < 1:
        raise TracrError(f"--batch must be >= 1 (got {args.batch})")
    if args.depth is not None and args.depth < 1:
        raise TracrError(
            f"--depth must be >= 1 (got {args.depth})", hint="leave it out for every graph node"
        )
    sm = build_split_model(
        args.model,
        seed=args.seed,
        weights=args.weights,
        depth=args.depth,
        mode=args.mode,
        batch=args.batch,
        input_shape=_shape(args.input_shape),
    )
    rows = []
    failed = []
    for p in sm.points:
        diff = None
        if args.verify and p.valid:
            diff = sm.verify(p.index, sm.example)
            if not diff <= args.tolerance:
                failed.append(p.index)
        rows.append(
            {
                "index": p.index,
                "name": p.layer,
                "type": p.type,
                "output_bytes": sm.layers[p.index - 1].output_bytes
                if p.index
                else sm.example.numel() * sm.example.element_size(),
                "crossing_bytes": p.crossing_bytes,
                "crossing": list(p.crossing),
                "cum_params": p.cum_params,
                "valid": p.valid,
                "mode": sm.mode,
                "max_abs_diff": diff,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        _print_splits(args, sm, rows)
    if failed:
        print(
            f"error: verification failed at {len(failed)} split(s): {failed[:10]} (tolerance {args.tolerance:g})",
            file=sys.stderr,
        )
        return 1
    return 0


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _print_splits(args: argparse.Namespace, sm, rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    valid = sum(r["valid"] for r in rows)
    shape = "x".join(map(str, sm.example.shape))
    table = Table(
        title=f"{args.model}: {len(rows)} split points ({valid} valid), mode={sm.mode}, input {shape}",
        caption="split k: layers 1..k on the edge, k+1..n on the cloud",
    )
    for col, just in (
        ("k", "right"),
        ("layer", "left"),
        ("type", "left"),
        ("output", "right"),
        ("crossing", "right"),
        ("tensors", "right"),
        ("cum params", "right"),
    ):
        table.add_column(col, justify=just)
    if args.verify:
        table.add_column("max |diff|", justify="right")
    for r in rows:
        cells = [
            str(r["index"]),
            r["name"],
            r["type"],
            _fmt_bytes(r["output_bytes"]),
            _fmt_bytes(r["crossing_bytes"]) if r["valid"] else "[dim]invalid[/dim]",
            str(len(r["crossing"])),
            f"{r['cum_params']:,}",
        ]
        if args.verify:
            d = r["max_abs_diff"]
            cells.append(
                "-" if d is None else (f"{d:.1e}" if d <= args.tolerance else f"[red]{d:.1e}[/red]")
            )
        table.add_row(*cells)
    Console().print(table)
