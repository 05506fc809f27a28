"""A run's summary and a bandwidth loop's table in the terminal (``tracr results show``,
and ``tracr experiment run`` when it ends).

The per-split table with the best split and its ties marked, then each part of the
summary the run has: the scored partitioners and the measurement noise, the metrics, an
adaptive partitioner against hindsight, a chain's configurations
(:mod:`app_api.cli.results_pipeline`), a transport sweep's pairs, the totals. rich is
imported inside the functions, for start-up time (:mod:`app_api.cli`).
"""

from __future__ import annotations

from pathlib import Path

from app_api.cli.cells import fixed, nbytes, percent, wide_console
from app_api.cli.results_pipeline import print_pipeline
from app_api.results.llm import llm_lines
from app_api.results.metrics import metrics_lines
from app_api.terminal import printable


def _ci(v) -> str:
    """``[lo, hi]`` as ``lo-hi``, compact."""
    return "-" if not v else f"{v[0]:.2f}-{v[1]:.2f}"


def _sum(a, b):
    if a is None and b is None:
        return None
    return (a or 0.0) + (b or 0.0)


def _rate(bps) -> str:
    return "-" if bps is None else f"{bps / 1e6:.2f} MB/s"


def _g(v) -> str:
    return "-" if v is None else f"{v:.3g}"


def print_summary(summary: dict, run_dir) -> None:
    """The per-split table with the best split marked, plus the run's totals."""
    from rich.table import Table

    console = wide_console()
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
        t.add_row(str(s["split"]), str(s["layer"]), cnt, fixed(s.get("e2e_ms_median")),
                  _ci(s.get("e2e_ms_ci95")), fixed(s.get("e2e_ms_p95")), fixed(edge), fixed(s.get("transfer_ms_median")),
                  fixed(cloud), nbytes(s.get("bytes_raw")), nbytes(s.get("bytes_encoded")), mark,
                  style=style)
    if summary.get("splits") or not summary.get("llm"):
        console.print(t)

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

    for line in metrics_lines(summary):
        console.print(line, highlight=False, markup=False)
    _print_adaptive(console, summary)
    print_pipeline(console, summary)
    _print_codecs(console, summary, run_dir)
    ov = fixed(summary.get("overhead"), 3)
    if (summary.get("pipeline") or {}).get("configs"):
        ov = "- (pipelined: inferences overlap)"  # wall / sum(e2e) < 1 says nothing here
    console.print(
        f"inferences: {summary.get('inferences')}  failed: {summary.get('failed')}  "
        f"status: {summary.get('status')}  wall: {fixed(summary.get('wall_s'))} s  "
        f"sum(e2e): {fixed(summary.get('sum_e2e_s'))} s  overhead: {ov}  "
        f"deploy: {fixed(summary.get('deploy_s'))} s  warm-up: {fixed(summary.get('warmup_s'))} s  "
        f"teardown: {fixed(summary.get('teardown_s'))} s"
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
                      f"{_rate(lab.get('bandwidth_Bps'))}, rtt {fixed(lab.get('rtt_ms'), 3)} ms")
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
        f"adaptive_over_best_fixed {fixed(a.get('adaptive_over_best_fixed'), 3)}  (adaptive "
        f"{fixed(a.get('adaptive_ms'))} ms, hindsight {fixed(a.get('hindsight_ms'))} ms, best fixed "
        f"split {a.get('best_fixed')} {fixed(a.get('best_fixed_ms'))} ms; mean over "
        f"{hs.get('intervals_scored')} intervals of {hs.get('interval_s')} s, aligned by "
        f"{hs.get('aligned_by')})", highlight=False)
    console.print(
        f"  against the per-interval best mean: {fixed(a.get('adaptive_over_hindsight_mean'), 3)};"
        f" hindsight over the best fixed split (what adapting could gain at most): "
        f"{fixed(a.get('hindsight_over_best_fixed'), 3)}", highlight=False)


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
                  nbytes(p.get("bytes_encoded")), fixed(p.get("encode_ms_median")),
                  fixed(p.get("decode_ms_median")), fixed(p.get("e2e_ms_median")),
                  fixed(p.get("top1_agreement"), 3), fixed(p.get("cosine_min"), 5),
                  fixed(p.get("cosine_median"), 5), _g(p.get("max_abs_diff_max")),
                  fixed(p.get("accuracy"), 3), ", ".join(marks),
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
                f"{fixed(best['ms'])} ms ({nbytes(best['bytes'])}, agreement "
                f"{fixed(best['top1_agreement'], 3)})")
        if base is None:
            text += ("; no compressed-input pair meets the floor" if a.get("baselines_measured")
                     else "; no compressed-input pair was measured")
        elif a.get("beats_baseline"):
            text += (f"; it beats the best compressed input ({base['transport']}, "
                     f"{fixed(base['ms'])} ms) by {fixed(a.get('speedup'))}x")
        elif best["split"] == base["split"] and best["transport"] == base["transport"]:
            text += "; it is the compressed input itself"
        else:
            text += f"; the compressed input ({base['transport']}, {fixed(base['ms'])} ms) is not beaten"
        console.print(escape(head + text), highlight=False)
    console.print("end to end at a bandwidth = measured edge + encode + decode + cloud medians "
                  "+ bytes sent / bandwidth", highlight=False)
    plot = Path(run_dir) / "plots" / "rate-fidelity.png"
    if plot.exists():
        console.print(escape(f"plot: {plot}"), highlight=False)


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
        regret = fixed(p.get("regret"), 3) + (" (tie)" if p.get("tie") else "")
        t.add_row(label, chosen, fixed(p.get("chosen_ms")), best,
                  fixed(p.get("best_ms")), regret, fixed(p.get("spearman"), 3),
                  percent(p.get("within_10pct")), str(p.get("criterion") or ""))
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


def print_group(group: dict, group_dir) -> None:
    """A bandwidth loop: per rate, the measured best split and each partitioner's choice."""
    from rich.table import Table

    console = wide_console()
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
                 f"{r.get('best')} ({r.get('best_layer')})", fixed(r.get("best_ms")),
                 fixed(r.get("noise_regret"), 3)]
        for label in labels:
            p = (r.get("partitioners") or {}).get(label)
            if not p:
                cells.append("-")
            elif p.get("error"):
                cells.append("error")
            else:
                cells.append(f"{p.get('chosen')} ({fixed(p.get('regret'), 3)})")
        t.add_row(*cells, str(r.get("status")))
    console.print(t)
    among = [f"{r['bandwidth']} {fixed(r['noise_contenders'], 3)}" for r in rows
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
    console.print(f"status: {group.get('status')}  wall: {fixed(group.get('wall_s'))} s{restored}")
    console.print(f"group: {group_dir}  (each rate's run: tracr results show "
                  f"{group_dir}/<bw-dir>)")
