"""`tracr results pareto`: a pipeline sweep's Pareto front, or a split sweep's latency
against energy (``--energy``).

rich and matplotlib are imported inside the command (matplotlib inside
:mod:`app_api.results.plots`), for start-up time (:mod:`app_api.cli`).
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Sequence
from pathlib import Path

from app_api.cli.cells import fixed, nbytes, wide_console
from app_api.results import (
    CONFIGS_FILE,
    find_run,
    load_summary,
    pareto_front,
    parse_objectives,
    read_configs,
    read_group_configs,
)
from app_api.results.energy import energy_front, energy_front_lines
from app_api.results.pareto import DEFAULT_OBJECTIVES, OBJECTIVES, ParetoGroup
from app_api.results.plots import draw_pareto
from app_api.results.store import load_group
from experiment_design.errors import TracrError

log = logging.getLogger(__name__)


NO_CONFIGS = "this run has no configurations: pareto needs a pipeline sweep (mode: throughput)"


def register(rsub: argparse._SubParsersAction, run_help: str) -> None:
    """Add ``pareto`` to ``tracr results``."""
    pareto = rsub.add_parser(
        "pareto", help="a pipeline sweep's Pareto front per bandwidth and batch",
        description="The configurations of a pipeline sweep (configs.csv) that no other "
                    "configuration at the same bandwidth and batch beats in every objective. "
                    "Draws plots/pareto.png when it is missing (or with --plot).")
    pareto.add_argument("run", metavar="RUN|last", help=run_help)
    pareto.add_argument("--objectives", default=",".join(DEFAULT_OBJECTIVES),
                        help="comma-separated, among: " + "; ".join(
                            f"{name} ({what})" for name, (_, _, what) in OBJECTIVES.items())
                        + "; default: %(default)s")
    pareto.add_argument("--all", action="store_true",
                        help="every configuration, the front marked (default: the front only)")
    pareto.add_argument("--plot", action="store_true",
                        help="redraw plots/pareto.png for these objectives even if it exists")
    pareto.add_argument("--json", action="store_true", help="machine-readable output")
    pareto.add_argument("--energy", action="store_true",
                        help="a split sweep's latency against energy per inference, per split "
                             "(summary.json energy_by_split)")
    pareto.set_defaults(func=cmd_pareto)


def cmd_pareto(args: argparse.Namespace) -> int:
    """The Pareto front of every (bandwidth, batch) group of a run's ``configs.csv``; draws
    ``plots/pareto.png`` when it is missing or ``--plot`` asks."""
    import json

    if getattr(args, "energy", False):
        return energy_pareto(args)
    objectives = parse_objectives(args.objectives)
    run_dir = Path(find_run(args.run))
    group = load_group(run_dir)  # a rate sweep: every rate's run, per rate
    if (run_dir / CONFIGS_FILE).is_file():
        rows = read_configs(run_dir)
    else:
        rows = read_group_configs(run_dir, group) if group is not None else []
    if not rows:
        raise TracrError(NO_CONFIGS, hint=f"{run_dir} has no {CONFIGS_FILE}; a split sweep's "
                                          f"results: tracr results show {args.run}")
    groups = pareto_front(rows, objectives)
    plot, drawn = _pareto_plot(groups, objectives, run_dir, redraw=args.plot)
    if args.json:
        print(json.dumps(pareto_json(groups, objectives, run_dir, plot, args.all), indent=2))
    else:
        print_pareto(groups, objectives, run_dir, args.all, plot, drawn)
    return 0


def energy_pareto(args: argparse.Namespace) -> int:
    """``results pareto --energy``: latency against energy per inference, per split."""
    import json

    run_dir = Path(find_run(args.run))
    summary = load_summary(run_dir)
    if summary is None:
        raise TracrError(f"{run_dir} has no summary.json (the run did not finish)")
    doc = energy_front(summary)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        for line in energy_front_lines(doc):
            print(line)
    return 0


def _pareto_plot(groups: list[ParetoGroup], objectives: Sequence[str], run_dir: Path,
                 redraw: bool) -> tuple[Path | None, bool]:
    """``plots/pareto.png``, drawn unless it exists (``redraw``: always); (path, drawn now).
    A plot that cannot be drawn (a read-only run directory) is a warning: the table stands."""
    path = run_dir / "plots" / "pareto.png"
    if path.exists() and not redraw:
        return path, False
    try:
        return draw_pareto(groups, objectives, run_dir), True
    except Exception as exc:
        log.warning("plots/pareto.png not drawn: %s", exc)
        return None, False


def pareto_json(groups: list[ParetoGroup], objectives: Sequence[str], run_dir: Path,
                plot: Path | None, every: bool) -> dict:
    """``--json``: per group its front (and with ``every`` each point with ``on_front``) as
    typed configs.csv rows, and the rows left out with the reason; NaN becomes null."""
    def clean(row: dict) -> dict:
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in row.items()}

    out_groups = []
    for g in groups:
        item: dict = {"bandwidth": g.bandwidth, "batch": g.batch,
                      "front": [clean(r) for r in g.front]}
        if every:
            item["points"] = [{**clean(r), "on_front": f}
                              for r, f in zip(g.points, g.on_front, strict=True)]
        item["excluded"] = [{"reason": why, "row": clean(r)} for r, why in g.excluded]
        out_groups.append(item)
    return {
        "run": str(run_dir),
        "objectives": [{"name": o, "column": OBJECTIVES[o][0],
                        "better": "lower" if OBJECTIVES[o][1] > 0 else "higher"}
                       for o in objectives],
        "groups": out_groups,
        "plot": str(plot) if plot else None,
    }


def print_pareto(groups: list[ParetoGroup], objectives: Sequence[str], run_dir: Path,
                 every: bool, plot: Path | None, drawn: bool) -> None:
    """One table per (bandwidth, batch) group: its front, or with ``every`` each
    configuration with the front marked; then the rows left out and what the front means."""
    from rich.markup import escape
    from rich.table import Table

    console = wide_console()
    if not groups:
        console.print(f"no configurations in {escape(str(run_dir))}/configs.csv yet",
                      highlight=False)
    for g in groups:
        shown = g.points if every else g.front
        t = Table(title=escape(f"{g.label}: {len(g.front)} of {len(g.points)} configurations "
                               "on the front"))
        cols = ["config", "mode", "chain", "in flight", "n", "p50 ms", "p95 ms", "inf/s",
                "bytes/inf"] + (["front"] if every else [])
        for col in cols:
            t.add_column(col, justify="left" if col in ("config", "mode", "chain") else "right")
        front_ids = {id(r) for r in g.front}
        for r in shown:
            on = id(r) in front_ids
            n = str(r.get("inferences") if r.get("inferences") is not None else "-")
            if r.get("errors"):
                n += f" ({r['errors']} failed)"
            cells = [str(r.get("config")), str(r.get("mode")), ";".join(r.get("chain") or []),
                     str(r.get("in_flight") if r.get("in_flight") is not None else "-"), n,
                     fixed(r.get("latency_ms_p50")), fixed(r.get("latency_ms_p95")),
                     fixed(r.get("throughput_per_s")), nbytes(r.get("bytes_per_inference"))]
            if every:
                cells.append("front" if on else "")
            t.add_row(*map(escape, cells), style="bold green" if every and on else None)
        if shown:
            console.print(t)
        else:
            console.print(escape(f"{g.label}: no configuration with every objective measured"),
                          highlight=False)
        for r, why in g.excluded:
            console.print(escape(f"  left out: {r.get('config')} {r.get('mode')} "
                                 f"({';'.join(r.get('chain') or [])}): {why}"), highlight=False)
    console.print("objectives: " + "; ".join(f"{o} ({OBJECTIVES[o][2]})" for o in objectives),
                  highlight=False)
    console.print("on the front: no other configuration at the same bandwidth and batch is as "
                  "good in every objective and better in one", highlight=False)
    if plot is not None:
        note = "" if drawn else "  (drawn before; --plot redraws it for these objectives)"
        console.print(escape(f"plot: {plot}{note}"), highlight=False)
