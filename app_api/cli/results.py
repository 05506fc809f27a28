"""`tracr results` commands: ls, show, compare, pareto."""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from app_api.terminal import printable

if TYPE_CHECKING:
    from app_api.results.pareto import ParetoGroup

log = logging.getLogger(__name__)


RUN_HELP = ("'last', an experiment's name (its latest run), EXPERIMENT/last, a run id, "
            "EXPERIMENT/RUN-ID, or a run directory")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``tracr results ...``."""
    from app_api.results.pareto import DEFAULT_OBJECTIVES, OBJECTIVES

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
    pareto = rsub.add_parser(
        "pareto", help="a pipeline sweep's Pareto front per bandwidth and batch",
        description="The configurations of a pipeline sweep (configs.csv) that no other "
                    "configuration at the same bandwidth and batch beats in every objective. "
                    "Draws plots/pareto.png when it is missing (or with --plot).")
    pareto.add_argument("run", metavar="RUN|last", help=RUN_HELP)
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
    from app_api.cli import results_plot

    results_plot.register(rsub, RUN_HELP)


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
    from app_api.results.store import load_group
    from experiment_design.errors import TracrError

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

    from app_api.results import find_run
    from app_api.results.compare import compare_runs

    doc = compare_runs([find_run(r) for r in args.runs])
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print_compare(doc)
    return 0


def _pct(v, signed: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v * 100:+.1f}%" if signed else f"{v * 100:.1f}%"


def print_compare(doc: dict) -> None:
    """The table of ``compare_runs``."""
    from rich.table import Table

    from app_api.results.compare import PARTS

    console = _console()
    t = Table(title=f"{doc['model']}: {len(doc['runs'])} runs side by side")
    for col in ("bandwidth", "best split: median ms, per run", "best moved", "same best",
                "whole run moved", "best beyond that", "edge ref moved", "cloud ref moved"):
        t.add_column(col, justify="right")
    for r in doc["rows"]:
        bests = "  ".join(f"{x['best']}: {_f(x['best_ms'], 1)}" for x in r["runs"])
        same = "yes" if r["same_best"] else ("tie" if r["bests_tie"] else "no")
        shift = " / ".join(_pct(s - 1.0, signed=True) if s is not None else "-"
                           for s in r["shift"][1:])
        ref = r["reference_moved"]
        t.add_row(str(r["bandwidth"]), bests, _pct(r["best_moved"]), same, shift,
                  _pct(r["best_moved_beyond_shift"]), _pct(ref.get("edge")),
                  _pct(ref.get("cloud")))
    console.print(t)
    p = Table(title="the first run's best split in each run: median ms (cpu: CPU time)")
    for col in ("bandwidth", "split", "run", *(k.replace("_", " ") for k in PARTS)):
        p.add_column(col, justify="right")
    for r in doc["rows"]:
        parts = r["parts"]
        for i in range(len(r["runs"])):
            p.add_row(str(r["bandwidth"]) if i == 0 else "", str(parts["split"]) if i == 0
                      else "", str(i + 1), *(_f(parts[k][i], 1) for k in PARTS))
    console.print(p)
    console.print("best moved: largest best median / smallest - 1.  same best: 'tie' when "
                  "each run's best is in every run's best set.  whole run moved: per run "
                  "after the first, the median over every split of its median / the first "
                  "run's.  ref: each device's whole model once at start-up (largest / "
                  "smallest - 1).")
    for r in doc["rows"]:
        if r.get("drift_could_explain"):
            console.print(f"{r['bandwidth']}: the best median moved {_pct(r['best_moved'])}, "
                          "within the machine's own drift during a run (reference workload: "
                          + ", ".join(_pct(d / 100) for d in r["machine_drift_pct"]
                                      if d is not None) + ")", highlight=False)
    if doc["left_out"]:
        console.print(f"not in every run: {', '.join(doc['left_out'])}")
    for run in doc["runs"]:
        console.print(f"run: {run}")


NO_CONFIGS = "this run has no configurations: pareto needs a pipeline sweep (mode: throughput)"


def cmd_pareto(args: argparse.Namespace) -> int:
    """The Pareto front of every (bandwidth, batch) group of a run's ``configs.csv``; draws
    ``plots/pareto.png`` when it is missing or ``--plot`` asks."""
    import json

    from app_api.results import (
        CONFIGS_FILE,
        find_run,
        pareto_front,
        parse_objectives,
        read_configs,
        read_group_configs,
    )
    from app_api.results.store import load_group
    from experiment_design.errors import TracrError

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

    from app_api.results import find_run, load_summary
    from app_api.results.energy import energy_front, energy_front_lines
    from experiment_design.errors import TracrError

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
        from app_api.results.plots import draw_pareto

        return draw_pareto(groups, objectives, run_dir), True
    except Exception as exc:
        log.warning("plots/pareto.png not drawn: %s", exc)
        return None, False


def pareto_json(groups: list[ParetoGroup], objectives: Sequence[str], run_dir: Path,
                plot: Path | None, every: bool) -> dict:
    """``--json``: per group its front (and with ``every`` each point with ``on_front``) as
    typed configs.csv rows, and the rows left out with the reason; NaN becomes null."""
    from app_api.results import OBJECTIVES

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

    from app_api.results import OBJECTIVES

    console = _console()
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
                     _f(r.get("latency_ms_p50")), _f(r.get("latency_ms_p95")),
                     _f(r.get("throughput_per_s")), _bytes(r.get("bytes_per_inference"))]
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


def _console():
    from rich.console import Console

    console = Console()
    if not console.is_terminal or console.width < 120:
        console = Console(width=max(console.width, 132))
    return console


def _f(v, nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _ci(v) -> str:
    """``[lo, hi]`` as ``lo-hi``, compact."""
    return "-" if not v else f"{v[0]:.2f}-{v[1]:.2f}"


def _bytes(v) -> str:
    from app_api.units import format_bytes

    return format_bytes(v)


def print_summary(summary: dict, run_dir) -> None:
    """The per-split table with the best split marked, plus the run's totals."""
    from rich.table import Table

    console = _console()
    best = summary.get("best_split")
    t = Table(title=f"{summary.get('experiment')} / {summary.get('run_id')} "
                    f"({summary.get('model')}, weights: {summary.get('weights')})")
    tied = set((summary.get("best_set") or {}).get("splits") or [])
    for col in ("split", "layer", "n", "e2e ms", "95% ci", "p95 ms", "edge ms", "transfer ms",
                "cloud ms", "bytes raw", "bytes sent", ""):
        t.add_column(col, justify="left" if col in ("layer", "") else "right")
    for s in summary.get("splits", []):
        mark = "best" if s["split"] == best else ("~best" if s["split"] in tied else "")
        edge = _sum(s.get("edge_ms_median"), s.get("encode_ms_median"))
        cloud = _sum(s.get("cloud_ms_median"), s.get("decode_ms_median"))
        style = "bold green" if mark == "best" else ("green" if mark else None)
        cnt = str(s["count"]) + (f" ({s['failed']} failed)" if s.get("failed") else "")
        t.add_row(str(s["split"]), str(s["layer"]), cnt, _f(s.get("e2e_ms_median")),
                  _ci(s.get("e2e_ms_ci95")), _f(s.get("e2e_ms_p95")), _f(edge), _f(s.get("transfer_ms_median")),
                  _f(cloud), _bytes(s.get("bytes_raw")), _bytes(s.get("bytes_encoded")), mark,
                  style=style)
    if summary.get("splits") or not summary.get("llm"):
        console.print(t)
    from app_api.results.llm import llm_lines  # a token pipeline's figures

    for line in llm_lines(summary):
        console.print(line, highlight=False)
    own = summary.get("split_transport")
    if own:
        whose = ("the run's own transport" if own.get("run_transport") == own["label"]
                 else f"the run's own, {own.get('run_transport')}, was not swept")
        console.print(f"per split: the {own['label']} rows alone ({own['inferences']} of "
                      f"{summary.get('inferences')} inferences; {whose}); every (split, "
                      "transport) pair is in the table below", highlight=False)
    bs = summary.get("best_set")
    if bs:
        console.print(f"best split {bs['best']}; indistinguishable at {bs['confidence']:.0%}: "
                      f"{', '.join(map(str, bs['splits']))} (~best; 95% ci: bootstrap interval "
                      "of the median)", highlight=False)
    budget = summary.get("latency_budget")
    if budget:
        console.print(f"latency budget: worst residual {budget['worst_residual_pct']:.2f}% of "
                      f"e2e (inference {budget['worst_inference']}), median "
                      f"{budget['median_residual_pct']:.3f}%, {budget['over_tolerance']} of "
                      f"{budget['inferences']} above {budget['tolerance_pct']:g}%", highlight=False)
    _print_partitioners(console, summary)
    from app_api.results.metrics import metrics_lines

    for line in metrics_lines(summary):
        console.print(line, highlight=False, markup=False)
    _print_adaptive(console, summary)
    _print_pipeline(console, summary)
    _print_codecs(console, summary, run_dir)
    ov = _f(summary.get("overhead"), 3)
    if (summary.get("pipeline") or {}).get("configs"):
        ov = "- (pipelined: inferences overlap)"  # wall / sum(e2e) < 1 says nothing here
    console.print(
        f"inferences: {summary.get('inferences')}  failed: {summary.get('failed')}  "
        f"status: {summary.get('status')}  wall: {_f(summary.get('wall_s'))} s  "
        f"sum(e2e): {_f(summary.get('sum_e2e_s'))} s  overhead: {ov}  "
        f"deploy: {_f(summary.get('deploy_s'))} s  warm-up: {_f(summary.get('warmup_s'))} s  "
        f"teardown: {_f(summary.get('teardown_s'))} s"
    )
    console.print("edge = prefix compute + encode; cloud = decode + suffix compute; "
                  "transfer = the rest of the edge's round trip")
    incomplete = summary.get("incomplete")
    if incomplete:
        from rich.markup import escape

        console.print(f"[bold red]incomplete:[/] {printable(incomplete.get('reason'), markup=True)}  "
                      f"(continue it: tracr experiment run {escape(str(summary.get('experiment')))}"
                      f" --resume {escape(str(run_dir))})", highlight=False)
    resumed = summary.get("resumed_from")
    if resumed:
        console.print(f"resumed from {resumed.get('run_id')}: its {resumed.get('rows')} "
                      "inference rows are kept in this run", highlight=False)
    lab = (summary.get("network") or {}).get("lab")
    if lab:
        conf = lab.get("configured") or {}
        console.print(f"lab link: shaped to {conf.get('bandwidth') or 'unshaped'}, measured "
                      f"{_rate(lab.get('bandwidth_Bps'))}, rtt {_f(lab.get('rtt_ms'), 3)} ms")
    console.print(f"results: {run_dir}")


def _print_adaptive(console, summary: dict) -> None:
    """The adaptive partitioner's scores against hindsight (app_api.results.hindsight)."""
    a = summary.get("adaptive")
    if not a:
        return
    hs = a.get("hindsight") or {}
    console.print(f"adaptive: {a.get('switches')} switches among splits {a.get('candidates')}, "
                  f"{(a.get('probes') or {}).get('count', 0)} probes; adaptive.csv, "
                  "plots/adaptive.png", highlight=False)
    if a.get("adaptive_over_hindsight") is None:
        console.print(f"  not scored: {hs.get('error') or 'no hindsight'}", highlight=False)
        return
    console.print(
        f"  adaptive_over_hindsight {a['adaptive_over_hindsight']:.3f}  "
        f"adaptive_over_best_fixed {_f(a.get('adaptive_over_best_fixed'), 3)}  (adaptive "
        f"{_f(a.get('adaptive_ms'))} ms, hindsight {_f(a.get('hindsight_ms'))} ms, best fixed "
        f"split {a.get('best_fixed')} {_f(a.get('best_fixed_ms'))} ms; mean over "
        f"{hs.get('intervals_scored')} intervals of {hs.get('interval_s')} s, aligned by "
        f"{hs.get('aligned_by')})", highlight=False)
    console.print(
        f"  against the per-interval best mean: {_f(a.get('adaptive_over_hindsight_mean'), 3)};"
        f" hindsight over the best fixed split (what adapting could gain at most): "
        f"{_f(a.get('hindsight_over_best_fixed'), 3)}", highlight=False)


def _rate(bps) -> str:
    return "-" if bps is None else f"{bps / 1e6:.2f} MB/s"


def _print_codecs(console, summary: dict, run_dir) -> None:
    """A transport sweep: per (split, transport) bytes, times and fidelity, the Pareto
    pairs marked; then, per bandwidth, the fastest pair above the fidelity floor against
    the best compressed-input pair."""
    codecs = summary.get("codecs")
    if not codecs:
        return
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="per (split, transport): bytes at the cut against fidelity (agreement, "
                    "cosine, max |diff|) with the unsplit model; pareto: bytes vs cosine")
    for col in ("split", "layer", "transport", "n", "bytes sent", "enc ms", "dec ms",
                "e2e ms", "top-1 agree", "cos min", "cos median", "max |diff|", "acc", ""):
        t.add_column(col, justify="left" if col in ("layer", "transport", "") else "right")
    for p in codecs.get("pairs") or []:
        marks = [m for m, on in (("pareto", p.get("pareto")),
                                 ("input baseline", p.get("input_baseline"))) if on]
        cnt = str(p["count"]) + (f" ({p['failed']} failed)" if p.get("failed") else "")
        t.add_row(str(p["split"]), escape(str(p["layer"])), escape(str(p["transport"])), cnt,
                  _bytes(p.get("bytes_encoded")), _f(p.get("encode_ms_median")),
                  _f(p.get("decode_ms_median")), _f(p.get("e2e_ms_median")),
                  _f(p.get("top1_agreement"), 3), _f(p.get("cosine_min"), 5),
                  _f(p.get("cosine_median"), 5), _g(p.get("max_abs_diff_max")),
                  _f(p.get("accuracy"), 3), ", ".join(marks),
                  style="bold green" if p.get("pareto") else None)
    console.print(t)
    if codecs.get("note"):
        console.print(escape(codecs["note"]), highlight=False)
    floor = codecs.get("floor")
    for a in codecs.get("answers") or []:
        head = f"at {a['bandwidth']} ({_rate(a['bandwidth_Bps'])}), top-1 agreement >= {floor}: "
        best, base = a.get("fastest"), a.get("baseline")
        if not best:
            console.print(escape(head + "no pair meets the floor"), highlight=False)
            continue
        text = (f"fastest is split {best['split']} ({best['layer']}) with {best['transport']}, "
                f"{_f(best['ms'])} ms ({_bytes(best['bytes'])}, agreement "
                f"{_f(best['top1_agreement'], 3)})")
        if base is None:
            text += ("; no compressed-input pair meets the floor" if a.get("baselines_measured")
                     else "; no compressed-input pair was measured")
        elif a.get("beats_baseline"):
            text += (f"; it beats the best compressed input ({base['transport']}, "
                     f"{_f(base['ms'])} ms) by {_f(a.get('speedup'))}x")
        elif best["split"] == base["split"] and best["transport"] == base["transport"]:
            text += "; it is the compressed input itself"
        else:
            text += f"; the compressed input ({base['transport']}, {_f(base['ms'])} ms) is not beaten"
        console.print(escape(head + text), highlight=False)
    console.print("end to end at a bandwidth = measured edge + encode + decode + cloud medians "
                  "+ bytes sent / bandwidth", highlight=False)
    plot = Path(run_dir) / "plots" / "rate-fidelity.png"
    if plot.exists():
        console.print(escape(f"plot: {plot}"), highlight=False)


def _g(v) -> str:
    return "-" if v is None else f"{v:.3g}"


def _print_partitioners(console, summary: dict) -> None:
    """Per scored partitioner: its choice, the measured best, regret, Spearman."""
    parts = summary.get("partitioners") or {}
    if not parts:
        return
    from rich.table import Table

    t = Table(title="partitioners scored against this sweep (regret = chosen ms / best ms)")
    for col in ("partitioner", "chosen", "chosen ms", "best", "best ms", "regret", "spearman",
                "within 10%", "note"):
        t.add_column(col, justify="left" if col in ("partitioner", "note") else "right")
    for label, p in parts.items():
        if p.get("error"):
            t.add_row(label, "-", "-", "-", "-", "-", "-", "-", printable(p["error"], markup=True))
            continue
        chosen, best = str(p.get("chosen")), str(p.get("best"))
        if p.get("transport"):  # a (split, transport) pair, scored among the measured pairs
            chosen, best = f"{chosen} {p['transport']}", f"{best} {p.get('best_transport')}"
        elif p.get("scored_on"):  # a split alone, on a codec sweep: that transport's pairs
            chosen, best = f"{chosen} {p['scored_on']}", f"{best} {p['scored_on']}"
        regret = _f(p.get("regret"), 3) + (" (tie)" if p.get("tie") else "")
        t.add_row(label, chosen, _f(p.get("chosen_ms")), best,
                  _f(p.get("best_ms")), regret, _f(p.get("spearman"), 3),
                  _pct(p.get("within_10pct")), str(p.get("criterion") or ""))
    console.print(t)
    if any(p.get("tie") for p in parts.values()):
        console.print("(tie) = the chosen split is in the best set: this sweep cannot tell it "
                      "from the best at 95%, whatever its regret", highlight=False)
    for label, p in parts.items():
        floor = p.get("floor")
        if floor and not p.get("error"):
            met = {True: "meets", False: "does NOT meet", None: "was not measured against"}[
                p.get("meets_floor_measured")]
            console.print(f"{label}: its pair {met} the floor {floor['metric']} >= "
                          f"{floor['min']} as measured; best = the fastest measured pair "
                          "that meets it")
    noise = summary.get("measurement_noise")
    if noise:
        console.print(f"measurement noise: split-half regret {noise['regret']:.3f} (the best split "
                      f"of half the repeats, scored on the other half; {noise['repeats_min']}"
                      f"-{noise['repeats_max']} repeats per split). A regret this close to 1.0 "
                      "cannot be told from a perfect choice.")
        among = noise.get("contenders")
        if among:
            console.print(f"  among the {among['splits']} contenders alone ({among['repeats_min']}"
                          f"-{among['repeats_max']} repeats each): {among['regret']:.3f}")
        pairs = noise.get("pairs")
        if pairs:
            console.print(f"  among the {pairs['pairs']} (split, transport) pairs with top-1 "
                          f"agreement >= {pairs['floor']} ({pairs['repeats_min']}-"
                          f"{pairs['repeats_max']} repeats each): {pairs['regret']:.3f}",
                          highlight=False)
    for name, part in (summary.get("partitioner") or {}).items():
        race = ((part or {}).get("decision") or {}).get("race") if isinstance(part, dict) else None
        if race and race.get("stopped"):
            why = {"separated": "the best was separated from every other contender",
                   "budget": "the budget ran out"}.get(race["stopped"], race["stopped"])
            console.print(f"race ({name}): stopped after {race.get('inferences')} inferences in "
                          f"{race.get('rounds')} rounds: {why} at {race.get('confidence'):.0%}; "
                          f"left: {', '.join(str(k) for k in race.get('contenders') or [])}")
            if race.get("best_halfwidth_pct") is not None:
                goal = race.get("precision")
                met = ("" if goal is None else
                       f" (precision {100 * goal:g}%: {'reached' if race.get('precise') else 'not reached'})")
                console.print(f"  best's median known to +/-{race['best_halfwidth_pct']:.1f}% "
                              f"at {race.get('confidence'):.0%}{met}", highlight=False)


MAX_CONFIGS = 20  # more (a sweep): `results show` lists the fastest and the baselines


def _chain_label(c: dict) -> str:
    """``edge-1>stage-1>cloud-1``."""
    return ">".join(c.get("chain") or [])


def _planned_stages(summary: dict, config: dict) -> list[dict]:
    """The chosen configuration's stages with the plan's per-stage figures: recorded on the
    stages, else (runs recorded before they were) from the decision that planned it."""
    stages = [dict(s) for s in config.get("stages") or []]
    if not stages or any("predicted_stage_ms" in s for s in stages):
        return stages
    for part in (summary.get("partitioner") or {}).values():
        plan = (((part or {}).get("decision") or {}).get("placement")) if isinstance(
            part, dict) else None
        if not plan or list(plan.get("cuts") or []) != list(config.get("cuts") or []) or \
                list(plan.get("chain") or []) != list(config.get("chain") or []):
            continue
        compute = plan.get("compute_ms") or []
        overhead = plan.get("overhead_ms") or [0.0] * len(compute)
        transfer = plan.get("transfer_ms") or []
        if not len(compute) == len(overhead) == len(transfer) == len(stages):
            continue
        from experiment_design.partitioners.pipeline import stage_time

        pipelined = plan.get("objective") == "throughput"
        for st, c, o, x in zip(stages, compute, overhead, transfer, strict=True):
            st.update(predicted_compute_ms=c, predicted_overhead_ms=o,
                      predicted_stage_ms=stage_time(c, o, x, pipelined))
    return stages


def _print_pipeline(console, summary: dict) -> None:
    """A chain's configurations (throughput against its bound and the prediction), the
    ratios the run reports, and the chosen configuration's stages, planned and measured."""
    pipe = summary.get("pipeline") or {}
    configs = pipe.get("configs") or []
    if not configs:
        return
    from rich.table import Table

    from app_api.results.store import config_label

    chosen = pipe.get("chosen") or {}

    def is_chosen(c: dict) -> bool:
        return bool(chosen) and all(c.get(k) == chosen.get(k) for k in ("cuts", "chain", "mode"))

    t = Table(title="pipeline configurations (bound = 1 / slowest stage's compute + "
                    "outgoing transfer, from this run)")
    for col in ("cuts", "chain", "mode", "in flight", "n", "inf/s", "bound/s",
                "predicted/s", "p50 ms", "p95 ms", "bytes/inf"):
        t.add_column(col, justify="left" if col in ("chain", "mode") else "right",
                     min_width=max(len(_chain_label(c)) for c in configs) if col == "chain"
                     else None)
    shown = configs
    if len(configs) > MAX_CONFIGS:  # a sweep: the chosen, the fastest and the baselines
        fastest = sorted((c for c in configs if c.get("mode") != "single"),
                         key=lambda c: -(c.get("throughput_per_s") or 0.0))[:5]
        keep = {id(c) for c in fastest} | {id(c) for c in configs
                                           if is_chosen(c) or c.get("mode") == "single"}
        shown = [c for c in configs if id(c) in keep]
    for c in shown:
        mark = is_chosen(c)
        n = str(c.get("inferences")) + (f" ({c['errors']} failed)" if c.get("errors") else "")
        t.add_row(config_label(c.get("cuts") or []), _chain_label(c),
                  str(c.get("mode")) + (" *" if mark else ""), str(c.get("in_flight", 1)), n,
                  _f(c.get("throughput_per_s")), _f(c.get("bound_per_s")),
                  _f(c.get("predicted_throughput_per_s")), _f(c.get("latency_ms_p50")),
                  _f(c.get("latency_ms_p95")), _bytes(c.get("bytes_per_inference")),
                  style="bold green" if mark else None)
    console.print(t)
    main = next((c for c in configs if is_chosen(c)), None)
    if main:
        console.print("* the configuration the run's ratios are of" + (
            "" if main.get("predicted_throughput_per_s") is not None else
            " (the first measured in throughput mode: no partitioner planned one)"),
            highlight=False, soft_wrap=True)
    if len(shown) < len(configs):
        console.print(f"{len(shown)} of {len(configs)} configurations (the fastest five, the "
                      "chosen, the single devices); all of them: summary.json, configs.csv; "
                      "the front: tracr results pareto", highlight=False, soft_wrap=True)
    ratios = {k: v for k, v in (pipe.get("ratios") or {}).items() if v is not None}
    if ratios:
        names = {"throughput_over_bound": "throughput / bound",
                 "pipelined_over_sequential": "pipelined / same stages one at a time",
                 "pipelined_over_single": f"pipelined / best single ({pipe.get('best_single')})",
                 "predicted_over_measured": "predicted / measured"}
        console.print("  ".join(f"{names.get(k, k)}: {v:.3f}" for k, v in ratios.items()),
                      highlight=False, soft_wrap=True)
    stages = _planned_stages(summary, main) if main else []
    if not stages:
        return
    planned = any(st.get("predicted_stage_ms") is not None for st in stages)
    t = Table(title=f"stages of {config_label(main.get('cuts') or [])} on "
                    f"{_chain_label(main)} ({main.get('mode')}): measured"
                    + (", and planned" if planned else ""))
    for col in ("stage", "device", "layers", "layers ms", "plan", "cpu ms", "plan beside",
                "xfer ms", "stage ms", "plan", "util", "bubble ms", "queue", "bytes out"):
        t.add_column(col, justify="left" if col in ("device", "layers") else "right")
    for st in stages:
        t.add_row(str(st.get("hop")), str(st.get("instance")),
                  f"{st.get('first')}..{st.get('last')}", _f(st.get("compute_ms")),
                  _f(st.get("predicted_compute_ms")), _f(st.get("cpu_ms")),
                  _f(st.get("predicted_overhead_ms")), _f(st.get("transfer_ms")),
                  _f(st.get("stage_ms")), _f(st.get("predicted_stage_ms")),
                  _f(st.get("utilization")), _f(st.get("bubble_ms"), 1),
                  _f(st.get("queue_mean")), _bytes(st.get("bytes_out")))
    console.print(t)
    console.print("layers ms: the stage's layers, median wall time (cpu ms: their CPU time); "
                  "plan beside: the CPU the plan gave the stage beside its layers (what it "
                  "receives and sends, its threads) as wall time; xfer: its outgoing transfer "
                  "at the probed link; stage ms = layers + xfer (the bound's terms); its plan: "
                  "the planned period (in throughput mode the slower of the CPU work and the "
                  "transfer, which overlap); the slowest planned stage sets the prediction",
                  highlight=False)


def print_group(group: dict, group_dir) -> None:
    """A bandwidth loop: per rate, the measured best split and each partitioner's choice."""
    from rich.table import Table

    console = _console()
    rows = group.get("rows") or []
    labels: list[str] = []
    for r in rows:
        labels += [x for x in (r.get("partitioners") or {}) if x not in labels]
    t = Table(title=f"{group.get('experiment')} / {group.get('group_id')} "
                    f"({group.get('model')}): how the best split moves with bandwidth")
    for col in ("bandwidth", "measured", "best split", "best ms", "noise"):
        t.add_column(col, justify="right")
    for label in labels:
        t.add_column(f"{label}\nchosen (regret)", justify="right")
    t.add_column("status")
    for r in rows:
        cells = [str(r.get("bandwidth")), _rate(r.get("measured_Bps")),
                 f"{r.get('best')} ({r.get('best_layer')})", _f(r.get("best_ms")),
                 _f(r.get("noise_regret"), 3)]
        for label in labels:
            p = (r.get("partitioners") or {}).get(label)
            if not p:
                cells.append("-")
            elif p.get("error"):
                cells.append("error")
            else:
                cells.append(f"{p.get('chosen')} ({_f(p.get('regret'), 3)})")
        t.add_row(*cells, str(r.get("status")))
    console.print(t)
    among = [f"{r['bandwidth']} {_f(r['noise_contenders'], 3)}" for r in rows
             if r.get("noise_contenders") is not None]
    if among:
        console.print(f"noise among the raced or refined contenders alone: {', '.join(among)}")
    missing = [b for b in group.get("bandwidths") or [] if b not in {r["bandwidth"] for r in rows}]
    if missing:
        console.print(f"not run: {', '.join(map(str, missing))}")
    for err in group.get("errors") or []:  # a participant's own words, often
        console.print(f"error: {printable(err, markup=True)}", highlight=False)
    after = group.get("lab_shaping_after")
    restored = ("" if after is None else
                f"  lab link restored to: {after.get('bandwidth') or 'unshaped'}")
    console.print(f"status: {group.get('status')}  wall: {_f(group.get('wall_s'))} s{restored}")
    console.print(f"group: {group_dir}  (each rate's run: tracr results show "
                  f"{group_dir}/<bw-dir>)")


def _sum(a, b):
    if a is None and b is None:
        return None
    return (a or 0.0) + (b or 0.0)
