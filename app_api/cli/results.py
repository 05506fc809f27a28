"""`tracr results` commands: ls, show."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``tracr results ...``."""
    p = sub.add_parser("results", help="list and show experiment results")
    rsub = p.add_subparsers(dest="results_cmd", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    ls = rsub.add_parser("ls", help="list runs (oldest first)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_ls)
    show = rsub.add_parser("show", help="per split point: latency split into edge/transfer/cloud")
    show.add_argument("run", metavar="RUN|last", help="run id, experiment/run-id, path, or 'last'")
    show.add_argument("--json", action="store_true", help="print summary.json exactly")
    show.set_defaults(func=cmd_show)


def cmd_ls(args: argparse.Namespace) -> int:
    """Every run under $TRACR_RESULTS_DIR."""
    import json

    from app_api.results import list_runs

    runs = list_runs()
    if args.json:
        print(json.dumps([{"experiment": r["experiment"], "run_id": r["run_id"],
                           "dir": str(r["dir"]), "status": (r["summary"] or {}).get("status")}
                          for r in runs], indent=2))
        return 0
    from rich.table import Table

    if not runs:
        print("no runs yet (tracr experiment run NAME)")
        return 0
    t = Table("experiment", "run id", "status", "inferences", "failed", "best split", "wall s")
    for r in runs:
        s = r["summary"] or {}
        t.add_row(r["experiment"], r["run_id"], str(s.get("status", "incomplete")),
                  str(s.get("inferences", "")), str(s.get("failed", "")),
                  str(s.get("best_split", "")), _f(s.get("wall_s"), 2))
    _console().print(t)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """One run's summary (``--json``: summary.json byte for byte)."""
    from app_api.results import find_run, load_summary
    from experiment_design.errors import TracrError

    run_dir = find_run(args.run)
    if args.json:
        path = Path(run_dir) / "summary.json"
        if not path.exists():
            raise TracrError(f"{run_dir} has no summary.json (the run did not finish)")
        print(path.read_text(), end="")
        return 0
    summary = load_summary(run_dir)
    if summary is None:
        raise TracrError(f"{run_dir} has no summary.json (the run did not finish)")
    print_summary(summary, run_dir)
    return 0


def _console():
    from rich.console import Console

    console = Console()
    if not console.is_terminal or console.width < 120:
        console = Console(width=max(console.width, 132))
    return console


def _f(v, nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _bytes(v) -> str:
    if v is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(v) < 1024 or unit == "GB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return str(v)


def print_summary(summary: dict, run_dir) -> None:
    """The per-split table with the best split marked, plus the run's totals."""
    from rich.table import Table

    console = _console()
    best = summary.get("best_split")
    t = Table(title=f"{summary.get('experiment')} / {summary.get('run_id')} "
                    f"({summary.get('model')}, weights: {summary.get('weights')})")
    for col in ("split", "layer", "n", "e2e ms", "p95 ms", "edge ms", "transfer ms", "cloud ms",
                "bytes raw", "bytes sent", ""):
        t.add_column(col, justify="left" if col in ("layer", "") else "right")
    for s in summary.get("splits", []):
        mark = "best" if s["split"] == best else ""
        edge = _sum(s.get("edge_ms_median"), s.get("encode_ms_median"))
        cloud = _sum(s.get("cloud_ms_median"), s.get("decode_ms_median"))
        style = "bold green" if mark else None
        cnt = str(s["count"]) + (f" ({s['failed']} failed)" if s.get("failed") else "")
        t.add_row(str(s["split"]), str(s["layer"]), cnt, _f(s.get("e2e_ms_median")),
                  _f(s.get("e2e_ms_p95")), _f(edge), _f(s.get("transfer_ms_median")),
                  _f(cloud), _bytes(s.get("bytes_raw")), _bytes(s.get("bytes_encoded")), mark,
                  style=style)
    console.print(t)
    ov = summary.get("overhead")
    console.print(
        f"inferences: {summary.get('inferences')}  failed: {summary.get('failed')}  "
        f"status: {summary.get('status')}  wall: {_f(summary.get('wall_s'))} s  "
        f"sum(e2e): {_f(summary.get('sum_e2e_s'))} s  overhead: {_f(ov, 3)}  "
        f"deploy: {_f(summary.get('deploy_s'))} s  warm-up: {_f(summary.get('warmup_s'))} s  "
        f"teardown: {_f(summary.get('teardown_s'))} s"
    )
    console.print("edge = prefix compute + encode; cloud = decode + suffix compute; "
                  "transfer = the rest of the edge's round trip")
    console.print(f"results: {run_dir}")


def _sum(a, b):
    if a is None and b is None:
        return None
    return (a or 0.0) + (b or 0.0)
