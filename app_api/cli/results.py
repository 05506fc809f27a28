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
    from app_api.runner.bandwidths import load_group
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
    _print_partitioners(console, summary)
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
    incomplete = summary.get("incomplete")
    if incomplete:
        from rich.markup import escape

        console.print(f"[bold red]incomplete:[/] {escape(str(incomplete.get('reason')))}  "
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


def _rate(bps) -> str:
    return "-" if bps is None else f"{bps / 1e6:.2f} MB/s"


def _print_partitioners(console, summary: dict) -> None:
    """Per scored partitioner: its choice, the measured best, regret, Spearman."""
    parts = summary.get("partitioners") or {}
    if not parts:
        return
    from rich.table import Table

    t = Table(title="partitioners scored against this sweep (regret = chosen ms / best ms)")
    for col in ("partitioner", "chosen", "chosen ms", "best", "best ms", "regret", "spearman",
                "note"):
        t.add_column(col, justify="left" if col in ("partitioner", "note") else "right")
    for label, p in parts.items():
        if p.get("error"):
            t.add_row(label, "-", "-", "-", "-", "-", "-", str(p["error"]))
            continue
        t.add_row(label, str(p.get("chosen")), _f(p.get("chosen_ms")), str(p.get("best")),
                  _f(p.get("best_ms")), _f(p.get("regret"), 3), _f(p.get("spearman"), 3),
                  str(p.get("criterion") or ""))
    console.print(t)
    noise = summary.get("measurement_noise")
    if noise:
        console.print(f"measurement noise: split-half regret {noise['regret']:.3f} (the best split "
                      f"of half the repeats, scored on the other half; {noise['repeats_min']}"
                      f"-{noise['repeats_max']} repeats per split). A regret this close to 1.0 "
                      "cannot be told from a perfect choice.")


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
    missing = [b for b in group.get("bandwidths") or [] if b not in {r["bandwidth"] for r in rows}]
    if missing:
        console.print(f"not run: {', '.join(map(str, missing))}")
    for err in group.get("errors") or []:
        console.print(f"error: {err}")
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
