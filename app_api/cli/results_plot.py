"""`tracr results plot` and `tracr results export`: a run's figures and its tables."""

from __future__ import annotations

import argparse
from pathlib import Path

from app_api.results import find_run, load_summary
from app_api.results.figstyle import FORMATS
from app_api.results.figures import draw_kinds
from app_api.results.frames import EXPORT_FORMATS, load
from app_api.results.report import write_report
from app_api.results.store import load_group
from experiment_design.errors import TracrError


def register(rsub: argparse._SubParsersAction, run_help: str) -> None:
    """Add ``plot`` and ``export`` to ``tracr results``."""
    kinds = ("latency", "bytes", "layers", "resources", "bandwidth", "pareto", "rate-fidelity",
             "timeline", "adaptive")
    plot = rsub.add_parser(
        "plot", help="draw a run's figures (300 dpi) and refresh its report.html",
        description="Draws every figure kind that applies to the run (or those --kind names) "
                    "into RUN/plots/, at 300 dpi, and rewrites RUN/report.html. Kinds: "
                    "latency (stacked edge / transfer / cloud per split with the bootstrap "
                    "interval; per stage for a chain), bytes, layers (per-layer time on each "
                    "device with the output size), resources (memory and energy per split, "
                    "when measured), bandwidth (the best split against the link rate), pareto, "
                    "rate-fidelity, timeline, adaptive.")
    plot.add_argument("run", metavar="RUN|last", help=run_help)
    plot.add_argument("--kind", action="append", choices=kinds, metavar="K",
                      help="a figure kind (repeat for several; default: all that apply)")
    plot.add_argument("--format", action="append", choices=FORMATS, dest="formats",
                      metavar="F", help="png, svg or pdf (repeat for several; default: png)")
    plot.set_defaults(func=cmd_plot)
    export = rsub.add_parser(
        "export", help="a run's tables as CSV, Parquet or JSON (needs pandas)",
        description="Writes inferences, layers, splits, stages and configs (those the run "
                    "has) and summary.json into --out (default RUN/export). From Python: "
                    "from app_api.results import load; run = load('last'); run.inferences.")
    export.add_argument("run", metavar="RUN|last", help=run_help)
    export.add_argument("--format", choices=EXPORT_FORMATS, default="csv",
                        help="the tables' file format")
    export.add_argument("--out", metavar="DIR", help="where to write (default: RUN/export)")
    export.set_defaults(func=cmd_export)


def cmd_plot(args: argparse.Namespace) -> int:
    """Draw the run's figures, then rewrite its report.html."""
    run_dir = Path(find_run(args.run))
    summary = load_summary(run_dir) or load_group(run_dir)
    if summary is None:
        raise TracrError(f"{run_dir} has no summary.json (the run did not finish)")
    paths = draw_kinds(summary, run_dir, args.kind, args.formats or ("png",))
    for p in paths:
        print(p)
    if not paths:
        print(f"no figure applies to {run_dir}" + (f" among {', '.join(args.kind)}"
                                                   if args.kind else ""))
    if load_summary(run_dir) is not None:
        print(write_report(run_dir))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write the run's tables in one format."""
    for p in load(args.run).export(args.format, args.out):
        print(p)
    return 0
