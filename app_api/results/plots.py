"""Plots of a run (matplotlib, Agg backend, imported only when drawing)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path

from app_api.fsutil import atomic_write
from app_api.results.pareto import DEFAULT_OBJECTIVES, OBJECTIVES, ParetoGroup, pareto_front
from app_api.results.store import read_configs


def draw(summary: dict, run_dir: Path) -> list[Path]:
    """Stacked edge/transfer/cloud latency per split and bytes per split, into plots/."""
    splits = [s for s in summary.get("splits", []) if s.get("e2e_ms_median") is not None]
    if not splits:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(run_dir) / "plots"
    out_dir.mkdir(exist_ok=True)
    labels = [f"{s['split']}\n{s['layer']}" for s in splits]
    xs = range(len(splits))
    width = max(6.0, 0.45 * len(splits))
    paths = []

    def val(s, k):
        return s.get(k) or 0.0

    fig, ax = plt.subplots(figsize=(width, 4.5))
    edge = [val(s, "edge_ms_median") + val(s, "encode_ms_median") for s in splits]
    transfer = [val(s, "transfer_ms_median") for s in splits]
    cloud = [val(s, "cloud_ms_median") + val(s, "decode_ms_median") for s in splits]
    ax.bar(xs, edge, label="edge (compute + encode)", color="#4c72b0")
    ax.bar(xs, transfer, bottom=edge, label="transfer", color="#dd8452")
    ax.bar(xs, cloud, bottom=[a + b for a, b in zip(edge, transfer, strict=False)],
           label="cloud (decode + compute)", color="#55a868")
    best = summary.get("best_split")
    for i, s in enumerate(splits):
        if s["split"] == best:
            ax.annotate("best", (i, s["e2e_ms_median"]), ha="center", va="bottom")
    ax.set_xticks(list(xs), labels, rotation=90, fontsize=7)
    ax.set_ylabel("median latency (ms)")
    ax.set_title(f"{summary.get('experiment', '')}: latency per split point")
    ax.legend()
    fig.tight_layout()
    p = out_dir / "latency_per_split.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    fig, ax = plt.subplots(figsize=(width, 4.0))
    raw = [s.get("bytes_raw") or 0 for s in splits]
    enc = [s.get("bytes_encoded") or 0 for s in splits]
    ax.bar([x - 0.2 for x in xs], raw, width=0.4, label="raw", color="#8172b2")
    ax.bar([x + 0.2 for x in xs], enc, width=0.4, label="encoded", color="#937860")
    ax.set_yscale("symlog")
    ax.set_xticks(list(xs), labels, rotation=90, fontsize=7)
    ax.set_ylabel("bytes crossing")
    ax.set_title("bytes per split point")
    ax.legend()
    fig.tight_layout()
    p = out_dir / "bytes_per_split.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths


#: marker per mode, so the two runs of the same cuts are told apart without reading labels
_MODE_MARKERS = {"throughput": "o", "latency": "s", "single": "^"}
_FRONT_COLOUR = "#c44e52"


def draw_pareto(groups: list[ParetoGroup], objectives: Sequence[str],
                run_dir: Path) -> Path | None:
    """``plots/pareto.png``: median latency (x) against throughput (y), one subplot per
    ``(bandwidth, batch)`` group; every point grey, the front in colour, joined in order of
    latency and labelled ``cuts mode``; with ``bytes`` among the objectives, a marker's area
    grows with its bytes per inference. None (nothing drawn) when no point has both axes.

    Written atomically: a reader never sees half a PNG.
    """
    x_col, y_col = OBJECTIVES["latency"][0], OBJECTIVES["throughput"][0]

    def plottable(rows: list[dict]) -> list[dict]:
        return [r for r in rows if all(r.get(c) is not None and math.isfinite(r[c])
                                       for c in (x_col, y_col))]

    shown = [g for g in groups if plottable(g.points)]
    if not shown:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    size = _SizeScale([r.get(OBJECTIVES["bytes"][0]) for g in shown for r in g.points]
                      if "bytes" in objectives else [])
    ncols = min(3, len(shown))
    nrows = -(-len(shown) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.6 * ncols, 5.4 * nrows), squeeze=False)
    for ax in axes.flat[len(shown):]:
        ax.set_visible(False)
    for ax, group in zip(axes.flat, shown, strict=False):
        rows = plottable(group.points)
        front_ids = {id(r) for r in group.front}
        modes = sorted({str(r.get("mode")) for r in rows})
        for mode in modes:
            pts = [r for r in rows if str(r.get("mode")) == mode]
            ax.scatter([r[x_col] for r in pts], [r[y_col] for r in pts],
                       s=[size(r) for r in pts], marker=_MODE_MARKERS.get(mode, "D"),
                       color="#b0b0b0", edgecolors="#808080", linewidths=0.5, label=f"{mode} mode")
        front = sorted((r for r in rows if id(r) in front_ids), key=lambda r: r[x_col])
        ax.plot([r[x_col] for r in front], [r[y_col] for r in front], color=_FRONT_COLOUR,
                linewidth=1.2, zorder=2, label=f"Pareto front ({', '.join(objectives)})")
        for r in front:
            ax.scatter([r[x_col]], [r[y_col]], s=[size(r)], zorder=3, color=_FRONT_COLOUR,
                       marker=_MODE_MARKERS.get(str(r.get("mode")), "D"), edgecolors="black",
                       linewidths=0.6)
            ax.annotate(f"{r.get('config')} {r.get('mode')}", (r[x_col], r[y_col]),
                        xytext=(4, 4), textcoords="offset points", fontsize=7)
        for b in size.keys:
            ax.scatter([], [], s=size({OBJECTIVES["bytes"][0]: b}), color="white",
                       edgecolors="#606060", label=f"{_bytes_text(b)} per inference")
        excluded = f", {len(group.excluded)} excluded" if group.excluded else ""
        ax.set_title(f"{group.label}: {len(front)} of {len(rows)} on the front{excluded}",
                     fontsize=9)
        ax.set_xlabel("latency p50 (ms)")
        ax.set_ylabel("throughput (inferences/s)")
        ax.grid(True, alpha=0.3)
        # under the axes: inside, it would hide points
        legend = ax.legend(fontsize=7, title="marker area = bytes" if size.keys else None,
                           title_fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16),
                           ncol=2, frameon=False)
        for handle, text in zip(legend.legend_handles, legend.get_texts(), strict=True):
            if text.get_text().endswith(" mode"):  # a mode's marker, not a size key
                handle.set_sizes([_SizeScale.FIXED])
    fig.suptitle(f"{Path(run_dir).name}: Pareto front over {', '.join(objectives)}", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return atomic_write(Path(run_dir) / "plots" / "pareto.png", buf.getvalue())


def draw_pareto_of_run(run_dir: Path, objectives: Sequence[str] = DEFAULT_OBJECTIVES
                       ) -> Path | None:
    """Read ``configs.csv`` of ``run_dir`` and draw ``plots/pareto.png`` from it."""
    return draw_pareto(pareto_front(read_configs(run_dir), objectives), objectives, run_dir)


class _SizeScale:
    """Marker area from bytes per inference, one scale for the whole figure; ``keys`` are the
    byte counts shown in the legend (none when bytes is not an objective)."""

    SMALL, LARGE, FIXED = 18.0, 260.0, 42.0

    def __init__(self, values: list[float | None]) -> None:
        vals = [v for v in values if v is not None]
        self.lo, self.hi = (min(vals), max(vals)) if vals else (0.0, 0.0)
        self.keys = sorted({self.lo, self.hi}) if vals else []

    def __call__(self, row: dict) -> float:
        b = row.get(OBJECTIVES["bytes"][0])
        if not self.keys or b is None:
            return self.FIXED
        if self.hi == self.lo:
            return (self.SMALL + self.LARGE) / 2
        return self.SMALL + (self.LARGE - self.SMALL) * (b - self.lo) / (self.hi - self.lo)


def _bytes_text(n: float) -> str:
    """``512 B``, ``1.5 KB`` (1024-based, as ``tracr results show`` prints bytes)."""
    if abs(n) < 1024:
        return f"{n:.0f} B"
    for unit in ("KB", "MB"):
        n /= 1024
        if abs(n) < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} GB"


def draw_timeline(run_dir: Path, window: int = 12) -> Path | None:
    """``plots/timeline.png``: the chosen configuration in throughput mode, one row per stage,
    for ``window`` consecutive inferences after the pipeline filled: compute spans (one colour
    per inference), sends (hatched) and the idle gaps between them (the bubbles). Times are
    each stage's own clock (one clock in the lab), from the first span shown."""
    from app_api.results.store import STAGES_FILE, read_csv

    path = Path(run_dir) / STAGES_FILE
    if not path.exists():
        return None
    rows = [r for r in read_csv(path) if r.get("mode") == "throughput" and not r.get("error")
            and r.get("t_start_ms") and r.get("t_end_ms")]
    if not rows:
        return None
    config = rows[0]["config"]
    rows = [r for r in rows if r["config"] == config]
    ids = sorted({int(r["inference"]) for r in rows})
    skip = min(len(ids) // 4, 4)
    keep = set(ids[skip: skip + window])
    rows = [r for r in rows if int(r["inference"]) in keep]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hops = sorted({int(r["hop"]) for r in rows})
    names = {int(r["hop"]): r["instance"] for r in rows}
    t0 = min(float(r["t_start_ms"]) for r in rows)
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.8 * len(hops)))
    for r in rows:
        y = hops.index(int(r["hop"]))
        start, end = float(r["t_start_ms"]) - t0, float(r["t_end_ms"]) - t0
        colour = cmap(int(r["inference"]) % 20)
        ax.broken_barh([(start, end - start)], (y - 0.35, 0.7), facecolors=colour)
        if r.get("t_sent_ms") and r.get("send_ms"):
            sent = float(r["t_sent_ms"]) - t0
            ax.broken_barh([(sent - float(r["send_ms"]), float(r["send_ms"]))],
                           (y - 0.35, 0.7), facecolors="none", edgecolors=colour, hatch="///")
    ax.set_yticks(range(len(hops)), [f"{h}: {names[h]}" for h in hops])
    ax.invert_yaxis()
    ax.set_xlabel("ms (each stage's own clock; one clock in the lab)")
    ax.set_title(f"pipeline timeline, cuts {config}, throughput mode: compute (solid), "
                 "send (hatched), idle (gaps)", fontsize=9)
    fig.tight_layout()
    out_dir = Path(run_dir) / "plots"
    out_dir.mkdir(exist_ok=True)
    out = out_dir / "timeline.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def draw_rate_fidelity(summary: dict, run_dir: Path) -> Path | None:
    """``plots/rate-fidelity.png``: per (split, transport) pair its median bytes at the cut
    (log x) against ``1 - cosine`` median (log y, lower is more faithful), one colour per
    split; the Pareto-optimal pairs ringed and labelled, the compressed-input baseline
    (split 0 as jpeg/webp) as its own series. Exact pairs (cosine 1) sit on the bottom
    edge. None when no pair has both figures."""
    pairs = [p for p in (summary.get("codecs") or {}).get("pairs") or []
             if p.get("bytes_encoded") and p.get("cosine_median") is not None]
    if not pairs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gaps = [1.0 - p["cosine_median"] for p in pairs]
    floor = min([g for g in gaps if g > 0], default=1e-6) / 10

    def y(p: dict) -> float:
        return max(1.0 - p["cosine_median"], floor)

    fig, ax = plt.subplots(figsize=(9.0, 6.0))
    cmap = plt.get_cmap("viridis")
    splits = sorted({p["split"] for p in pairs})
    for i, k in enumerate(splits):
        pts = [p for p in pairs if p["split"] == k and not p["input_baseline"]]
        if pts:
            ax.scatter([p["bytes_encoded"] for p in pts], [y(p) for p in pts], s=26,
                       color=cmap(i / max(1, len(splits) - 1)), label=f"split {k}", zorder=2)
    base = [p for p in pairs if p["input_baseline"]]
    if base:
        ax.scatter([p["bytes_encoded"] for p in base], [y(p) for p in base], s=70, marker="*",
                   color="#dd8452", edgecolors="black", linewidths=0.5, zorder=3,
                   label="compressed input (split 0)")
    front = sorted((p for p in pairs if p.get("pareto")), key=lambda p: p["bytes_encoded"])
    ax.plot([p["bytes_encoded"] for p in front], [y(p) for p in front], color=_FRONT_COLOUR,
            linewidth=1.0, zorder=1, label="Pareto front (bytes, cosine)")
    for p in front:
        ax.scatter([p["bytes_encoded"]], [y(p)], s=110, facecolors="none",
                   edgecolors=_FRONT_COLOUR, linewidths=1.2, zorder=4)
        ax.annotate(f"{p['split']} {p['transport']}", (p["bytes_encoded"], y(p)),
                    xytext=(5, 4), textcoords="offset points", fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes at the cut (median, encoded)")
    ax.set_ylabel(f"1 - cosine vs the unsplit model (median; exact at {floor:.0e})")
    ax.set_title(f"{summary.get('experiment', '')}: bytes against fidelity per (split, transport)"
                 f" ({summary.get('model')}, weights: {summary.get('weights')})", fontsize=9)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.12),
              frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    (Path(run_dir) / "plots").mkdir(exist_ok=True)
    return atomic_write(Path(run_dir) / "plots" / "rate-fidelity.png", buf.getvalue())
