"""`tracr model ls`, `tracr model splits MODEL` and `tracr model coverage`: the registry,
every cut of a model, and which torchvision builders split."""

from __future__ import annotations

import argparse
import json
import sys

from app_api.model_coverage import plan, run_coverage
from app_api.units import format_bytes
from experiment_design.errors import TracrError
from experiment_design.models import get_model_spec, list_models


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

    cv = cmds.add_parser(
        "coverage", help="which torchvision builders split, in which mode, and how exactly"
    )
    cv.add_argument(
        "--family",
        action="append",
        choices=("classification", "segmentation", "detection"),
        help="a family of builders (repeatable; default: all three)",
    )
    cv.add_argument("--models", default=None, help="only these builders, e.g. resnet18,vgg11")
    cv.add_argument(
        "--sample", type=int, default=5, help="cuts run per model, first and last included"
    )
    cv.add_argument(
        "--max-params",
        type=float,
        default=1e9,
        help="skip builders with more parameters (default 1e9: none of torchvision's)",
    )
    cv.add_argument("--tolerance", type=float, default=1e-5, help="max abs diff called exact")
    cv.add_argument("--seed", type=int, default=0)
    cv.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    cv.set_defaults(func=cmd_coverage)
    p.set_defaults(func=lambda args: p.print_help())


def _shape(text: str | None) -> tuple[int, ...] | None:
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
    from experiment_design.split import build_split_model  # loads torch: not at tracr --help

    try:
        return build_split_model(name, input_shape=spec.min_input_shape).mode
    except TracrError as exc:
        return f"error: {exc.message}"


def cmd_splits(args: argparse.Namespace) -> int:
    from experiment_design.split import build_split_model  # loads torch: not at tracr --help

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
    return format_bytes(n)


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
        ("values", "right"),
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


def cmd_coverage(args: argparse.Namespace) -> int:
    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
    pairs = plan(args.family, models)
    report = run_coverage(
        pairs,
        sample=args.sample,
        tolerance=args.tolerance,
        max_params=int(args.max_params) if args.max_params > 0 else None,
        seed=args.seed,
        progress=_coverage_progress,
    )
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_coverage(report)
    return 0 if all(t["met"] for t in report["totals"]) else 1


def _coverage_progress(row) -> None:
    c = row.check
    cuts = f"{c.valid_cuts}/{c.cuts} cuts valid" if c.cuts is not None else "-"
    line = f"{row.family} {row.model} ({row.part}): {row.status}, {c.mode or '-'}, {cuts}, {c.seconds:.1f} s"
    if row.reason:
        line += f" -- {row.reason}"
    print(line, file=sys.stderr, flush=True)


def _print_coverage(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for t in report["totals"]:
        family = t["family"]
        rows = [r for r in report["models"] if r["family"] == family]
        part = " (backbone + neck)" if family == "detection" else ""
        table = Table(title=f"{family}{part}: {len(rows)} torchvision builder(s), random weights")
        columns = ["model", "status", "mode", "layers", "valid cuts", "diff", "s"]
        if family == "detection":
            columns.append("whole detector")
        for col in columns:
            table.add_column(col, justify="left" if col in ("model", "status", "mode") else "right")
        for r in rows:
            status = r["status"] if r["status"] == "ok" else f"[red]{r['status']}[/red]"
            cells = [
                r["model"],
                status + (f": {r['reason']}" if r["reason"] else ""),
                r["mode"] or "-",
                "-" if r["layers"] is None else str(r["layers"]),
                "-" if r["cuts"] is None else f"{r['valid_cuts']}/{r['cuts']}",
                "-" if r["worst_diff"] is None else f"{r['worst_diff']:.1e}",
                f"{r['seconds']:.1f}",
            ]
            if family == "detection":
                cells.append("-" if r["detector"] is None else _detector_cell(r["detector"]))
            table.add_row(*cells)
        console.print(table)
    tol = report["settings"]["tolerance"]
    totals = Table(
        title="per family, against the targets",
        caption=f"diff: worst max abs difference to the unsplit output at the sampled cuts; exact: <= {tol:g}",
    )
    for col in ("family", "split exactly", "all cuts valid", "valid cuts", "worst diff", "met"):
        totals.add_column(col)
    for t in report["totals"]:
        share = "-" if t["valid_cut_share"] is None else f"{100 * t['valid_cut_share']:.1f}%"
        totals.add_row(
            t["family"],
            f"{t['split']}/{t['models']}" + (f" ({t['skipped']} skipped)" if t["skipped"] else ""),
            f"{t['all_cuts_valid']}/{t['models']}",
            f"{t['valid_cuts']}/{t['cuts']} ({share})",
            "-" if t["worst_diff"] is None else f"{t['worst_diff']:.1e}",
            "yes" if t["met"] else f"[red]no[/red]: {t['target']}",
        )
    console.print(totals)


def _detector_cell(det: dict) -> str:
    if det["error"] and det["mode"] is None:
        return f"[red]no[/red] ({det['error']})"
    cell = f"{det['mode']}, {det['valid_cuts']}/{det['cuts']}"
    if det["error"]:
        return f"{cell}, [red]{det['error']}[/red]"
    if not det["splits"]:
        return f"{cell}, [red]only cuts 0 and n[/red]"
    if not det["exact"]:
        return f"{cell}, [red]diff {det['worst_diff']:.1e}[/red]"
    return cell + (", exact" if det["output_elements"] else ", exact (empty output)")
