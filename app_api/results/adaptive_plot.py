"""``plots/adaptive.png``: an adaptive run's choices against the link it met.

Top panel: the link's configured rate (the lab's timeline, ``link.csv``, when the run
has one) and the partitioner's online estimate, in MB/s on a log axis, probes marked.
Bottom panel: every adaptive inference's end-to-end latency (left axis) and the split it
ran at (right axis), with the hindsight best split of each interval of the trace (from
the sweep phase) beside it. Time is seconds since the adaptive phase began; switches
are faint vertical lines in both panels.
"""

from __future__ import annotations

import math
from pathlib import Path

from app_api.results import figstyle
from app_api.results.adaptive import ADAPTIVE_FILE
from app_api.results.hindsight import TraceClock, in_ranges
from app_api.results.store import read_csv

LINK_FILE = "link.csv"


def _num(v) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def draw_adaptive(summary: dict, run_dir: Path, formats: tuple[str, ...] = ("png",)
                  ) -> Path | None:
    """Draw ``plots/adaptive.<fmt>`` from the run directory (tracr's figure style:
    :mod:`.figstyle`); the first file written, None without an adaptive phase."""
    block = summary.get("adaptive") or {}
    bounds = (block.get("phases") or {}).get("adaptive")
    if not bounds or bounds[0] is None:
        return None
    run_dir = Path(run_dir)
    t0, t1 = float(bounds[0]), float(bounds[1] or bounds[0])
    ids = sorted(block.get("sweep_ids") or [])
    rows = [r for r in read_csv(run_dir / "inferences.csv")
            if not r.get("error") and _num(r.get("t_unix")) is not None
            and t0 <= float(r["t_unix"]) <= t1 and _num(r.get("e2e_ms")) is not None
            and not (ids and in_ranges(int(r["inference"]), ids))]
    events = read_csv(run_dir / ADAPTIVE_FILE) if (run_dir / ADAPTIVE_FILE).exists() else []
    link = read_csv(run_dir / LINK_FILE) if (run_dir / LINK_FILE).exists() else []
    if block.get("link") and link and "link" in link[0]:  # the edge's egress only
        link = [e for e in link if [e.get("link"), e.get("dir")] == list(block["link"])]
    if not rows:
        return None
    plt = figstyle.pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(figstyle.TEXT_IN, 5.2), sharex=True,
                                      gridspec_kw={"height_ratios": [1, 1.2]})
    x_end = t1 - t0
    # -- the link ----------------------------------------------------------------------
    rates = [(float(e["t"]) - t0, float(e["rate_Bps"]) / 1e6) for e in link
             if _num(e.get("t")) is not None and _num(e.get("rate_Bps")) is not None]
    if rates:
        before = [r for r in rates if r[0] <= 0]
        pts = ([(0.0, before[-1][1])] if before else []) + [r for r in rates if 0 < r[0] <= x_end]
        pts.append((x_end, pts[-1][1]))
        top.step([p[0] for p in pts], [p[1] for p in pts], where="post", color="#333333",
                 lw=1.4, label="configured rate (trace)")
    est = [(float(e["t_unix"]) - t0, float(e["estimate_Bps"]) / 1e6) for e in events
           if _num(e.get("estimate_Bps")) is not None and _num(e.get("t_unix")) is not None
           and float(e["t_unix"]) >= t0]
    if est:
        top.plot([p[0] for p in est], [p[1] for p in est], color="#dd8452", lw=1.2,
                 label="online estimate")
    probes = [(float(e["t_unix"]) - t0, float(e["estimate_Bps"]) / 1e6) for e in events
              if e.get("event") == "probe" and _num(e.get("estimate_Bps")) is not None]
    if probes:
        top.plot([p[0] for p in probes], [p[1] for p in probes], "v", ms=4, color="#c44e52",
                 ls="none", label="estimate after a probe")
    top.set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    top.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    # minor labels at 2x and 5x only: every minor tick labelled crowds a decade
    top.yaxis.set_minor_formatter(FuncFormatter(
        lambda v, _: f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v))) in (2, 5)
        else ""))
    top.tick_params(axis="y", which="minor", labelsize=6)
    top.set_ylabel("link rate (MB/s)")
    top.grid(True, which="both", alpha=0.25)
    top.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=3, frameon=False)
    if not rates:
        top.text(0.99, 0.03, "no link timeline in this run: the estimate only",
                 transform=top.transAxes, ha="right", va="bottom", color="#555555")
    # -- the choices -------------------------------------------------------------------
    xs = [float(r["t_unix"]) + float(r["e2e_ms"]) / 2e3 - t0 for r in rows]
    bottom.plot(xs, [float(r["e2e_ms"]) for r in rows], ".", ms=3, color="#4c72b0",
                alpha=0.6, label="end-to-end latency (left)")
    bottom.set_ylabel("end-to-end latency (ms)")
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("time since the adaptive phase began (s)" + (
        "; interleaved with the sweep's blocks" if ids else ""))
    bottom.grid(True, alpha=0.25)
    right = bottom.twinx()
    right.step(xs, [int(r["split"]) for r in rows], where="post", color="#55a868", lw=1.6,
               label="adaptive split (right)")
    hs = block.get("hindsight") or {}
    clock_note = ""
    if hs.get("intervals") and hs.get("interval_s") and hs.get("clock"):
        # the interval each adaptive inference fell in, and that interval's best fixed split
        best = {r["interval"]: r.get("best_split") for r in hs["intervals"]}
        clock = TraceClock(**hs["clock"])
        per = {x: best.get(int(clock.position(t0 + x) // float(hs["interval_s"])))
               for x in xs}
        hx = [x for x in xs if per[x] is not None]
        if hx:
            right.step(hx, [per[x] for x in hx], where="post", color="#8172b2", lw=1.2,
                       ls="--", label="hindsight best fixed split (right)")
        clock_note = f", intervals of {hs['interval_s']:g} s"
    cands = sorted({int(r["split"]) for r in rows} | set(block.get("candidates") or []))
    right.set_yticks(cands)
    right.set_ylabel("split index (layers on the edge)")
    right.set_ylim(min(cands) - 1, max(cands) + 1)
    for e in events:
        if e.get("event") == "switch" and _num(e.get("t_unix")) is not None:
            for ax in (top, bottom):
                ax.axvline(float(e["t_unix"]) - t0, color="#999999", lw=0.6, alpha=0.5)
    handles = bottom.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    bottom.legend(handles[0] + more[0], handles[1] + more[1], loc="lower left",
                  bbox_to_anchor=(0.0, 1.0), ncol=3, frameon=False)
    ratio = block.get("adaptive_over_hindsight")
    fixed = block.get("adaptive_over_best_fixed")
    head = f"{summary.get('experiment', '')}: adaptive split against the link"
    if ratio is not None:
        head += (f"\nadaptive / hindsight {ratio:.3f}, adaptive / best fixed "
                 f"(split {block.get('best_fixed')}) "
                 + (f"{fixed:.3f}" if fixed is not None else "n/a") + clock_note)
    fig.suptitle(head)
    top.set_xlim(0, max(x_end, 1e-3))
    fig.tight_layout()
    figstyle.caption(fig, summary, figstyle.load_envs(run_dir),
                     f"{len(rows)} adaptive inferences, {block.get('switches')} switches, "
                     f"{(block.get('probes') or {}).get('count', 0)} probes")
    return figstyle.save(fig, run_dir, "adaptive", formats)[0]
