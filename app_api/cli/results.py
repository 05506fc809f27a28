"""`tracr results` commands: ls, show, compare; pareto (:mod:`app_api.cli.results_pareto`),
plot and export (:mod:`app_api.cli.results_plot`).

rich is imported inside the commands, for start-up time (:mod:`app_api.cli`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from app_api.cli import results_pareto, results_plot
from app_api.cli.cells import fixed, percent, wide_console
from app_api.cli.results_summary import print_group, print_summary
from app_api.results import find_run, list_runs, load_summary
from app_api.results.compare import PARTS, compare_runs
from app_api.results.store import load_group
from experiment_design.errors import TracrError

RUN_HELP = ("'last', an experiment's name (its latest run), EXPERIMENT/last, a run id, "
            "EXPERIMENT/RUN-ID, or a run directory")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``tracr results ...``."""
    p = sub.add_parser("results", help="list and show experiment results")
    rsub = p.add_subparsers(dest="results_cmd", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    ls = rsub.add_parser("ls", help="list runs (oldest first)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_ls)
    show = rsub.add_parser("show", help="per split point: latency split into edge/transfer/cloud")
    show.add_argument("run", metavar="RUN|last", help=RUN_HELP)
    show.add_argument("--json", action="store_true", help="print summary.json exactly")
    show.set_defaults(func=cmd_show)
    cmp_ = rsub.add_parser(
        "compare", help="runs of one experiment side by side: how far the best split moved",
        description="Per bandwidth: each run's best split and median, how far the best "
                    "median moved between runs, how far the whole run moved (the median "
                    "over every split of its ratio to the first run) and each device's "
                    "start-up reference (the whole model once, before the sweep). A best "
                    "median that moved with everything else is the machine's speed, not "
                    "the split's.")
    cmp_.add_argument("runs", nargs="+", metavar="RUN", help=RUN_HELP + "; two or more")
    cmp_.add_argument("--json", action="store_true", help="machine-readable output")
    cmp_.set_defaults(func=cmd_compare)
    results_pareto.register(rsub, RUN_HELP)
    results_plot.register(rsub, RUN_HELP)


def cmd_ls(args: argparse.Namespace) -> int:
    """Every run under $TRACR_RESULTS_DIR."""
    import json

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
                  str(s.get("best_split", "")), fixed(s.get("wall_s"), 2))
    wide_console().print(t)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """One run's summary (``--json``: summary.json byte for byte)."""
    run_dir = find_run(args.run)
    group = load_group(run_dir)
    if group is not None:
        if args.json:
            print((Path(run_dir) / "group.json").read_text(), end="")
        else:
            print_group(group, run_dir)
        return 0
    if args.json:
        path = Path(run_dir) / "summary.json"
        if not path.exists():
            raise TracrError(f"{run_dir} has no summary.json (the run did not finish)")
        print(path.read_text(), end="")
        return 0
    summary = load_summary(run_dir)
    if summary is None:
        raise TracrError(f"{run_dir} has no summary.json (the run did not finish)",
                         hint=f"continue it: tracr experiment run NAME --resume {run_dir}")
    print_summary(summary, run_dir)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Runs of one experiment side by side (see app_api.results.compare)."""
    import json

    doc = compare_runs([find_run(r) for r in args.runs])
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print_compare(doc)
    return 0


def print_compare(doc: dict) -> None:
    """The table of ``compare_runs``."""
    from rich.table import Table

    console = wide_console()
    t = Table(title=f"{doc['model']}: {len(doc['runs'])} runs side by side")
    for col in ("bandwidth", "best split: median ms, per run", "best moved", "same best",
                "whole run moved", "best beyond that", "edge ref moved", "cloud ref moved"):
        t.add_column(col, justify="right")
    for r in doc["rows"]:
        bests = "  ".join(f"{x['best']}: {fixed(x['best_ms'], 1)}" for x in r["runs"])
        same = "yes" if r["same_best"] else ("tie" if r["bests_tie"] else "no")
        shift = " / ".join(percent(s - 1.0, signed=True) if s is not None else "-"
                           for s in r["shift"][1:])
        ref = r["reference_moved"]
        t.add_row(str(r["bandwidth"]), bests, percent(r["best_moved"]), same, shift,
                  percent(r["best_moved_beyond_shift"]), percent(ref.get("edge")),
                  percent(ref.get("cloud")))
    console.print(t)
    p = Table(title="the first run's best split in each run: median ms (cpu: CPU time)")
    for col in ("bandwidth", "split", "run", *(k.replace("_", " ") for k in PARTS)):
        p.add_column(col, justify="right")
    for r in doc["rows"]:
        parts = r["parts"]
        for i in range(len(r["runs"])):
            p.add_row(str(r["bandwidth"]) if i == 0 else "", str(parts["split"]) if i == 0
                      else "", str(i + 1), *(fixed(parts[k][i], 1) for k in PARTS))
    console.print(p)
    console.print("best moved: largest best median / smallest - 1.  same best: 'tie' when "
                  "each run's best is in every run's best set.  whole run moved: per run "
                  "after the first, the median over every split of its median / the first "
                  "run's.  ref: each device's whole model once at start-up (largest / "
                  "smallest - 1).")
    for r in doc["rows"]:
        if r.get("drift_could_explain"):
            console.print(f"{r['bandwidth']}: the best median moved {percent(r['best_moved'])}, "
                          "within the machine's own drift during a run (reference workload: "
                          + ", ".join(percent(d / 100) for d in r["machine_drift_pct"]
                                      if d is not None) + ")", highlight=False)
    if doc["left_out"]:
        console.print(f"not in every run: {', '.join(doc['left_out'])}")
    for run in doc["runs"]:
        console.print(f"run: {run}")
