"""Plots of a run (matplotlib, Agg backend, imported only when drawing)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from app_api.results.chain_plots import chain_length, draw_chain_latency
from app_api.results.chain_plots import draw_timeline as draw_chain_timeline
from app_api.results.figstyle import TEXT_IN, caption, load_envs, pyplot, save
from app_api.results.pareto import DEFAULT_OBJECTIVES, OBJECTIVES, ParetoGroup, pareto_front
from app_api.results.split_plots import draw_split_figures
from app_api.results.store import load_summary, read_configs
from app_api.units import format_bytes


def draw(summary: dict, run_dir: Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """The figures per split point (:mod:`app_api.results.split_plots`) of a two-party run;
    a chain of three or more stages gets the per-stage latency of each configuration
    instead (:func:`app_api.results.chain_plots.draw_chain_latency`)."""
    if chain_length(run_dir) > 2:
        return draw_chain_latency(summary, run_dir, formats)
    return draw_split_figures(summary, run_dir, formats)


#: marker per mode, so the two runs of the same cuts are told apart without reading labels
_MODE_MARKERS = {"throughput": "o", "latency": "s", "single": "^"}
_FRONT_COLOUR = "#c44e52"


def draw_pareto(groups: list[ParetoGroup], objectives: Sequence[str],
                run_dir: Path, formats: Sequence[str] = ("png",)) -> Path | None:
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

    plt = pyplot()
    size = _SizeScale([r.get(OBJECTIVES["bytes"][0]) for g in shown for r in g.points]
                      if "bytes" in objectives else [])
    ncols = min(3, len(shown))
    nrows = -(-len(shown) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.5 * ncols, 3.6 * nrows), squeeze=False)
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
                     fontsize=8)
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

    summary = load_summary(run_dir) or {"experiment": Path(run_dir).parent.name}
    fig.suptitle(f"{summary.get('experiment')}: Pareto front over {', '.join(objectives)}")
    fig.tight_layout()
    if summary.get("model"):
        caption(fig, summary, load_envs(run_dir))
    return save(fig, run_dir, "pareto", formats)[0]


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
    """``512 B``, ``1.5 KiB`` (as ``tracr results show`` prints bytes)."""
    return format_bytes(n)


def draw_timeline(run_dir: Path, window: int = 12) -> Path | None:
    """``plots/timeline.png`` (:func:`app_api.results.chain_plots.draw_timeline`), or None."""
    paths = draw_chain_timeline(run_dir, window)
    return paths[0] if paths else None


def draw_rate_fidelity(summary: dict, run_dir: Path,
                       formats: Sequence[str] = ("png",)) -> Path | None:
    """``plots/rate-fidelity.png``: per (split, transport) pair its median bytes at the cut
    (log x) against ``1 - cosine`` median (log y, lower is more faithful), coloured by split
    (a colour bar, not a legend entry per split); the Pareto-optimal pairs ringed and
    labelled (labels that would overlap are moved apart), the compressed-input baseline
    (split 0 as jpeg/webp) as its own series. Exact pairs (cosine 1) sit on the bottom
    edge. None when no pair has both figures."""
    pairs = [p for p in (summary.get("codecs") or {}).get("pairs") or []
             if p.get("bytes_encoded") and p.get("cosine_median") is not None]
    if not pairs:
        return None

    plt = pyplot()
    gaps = [1.0 - p["cosine_median"] for p in pairs]
    floor = min([g for g in gaps if g > 0], default=1e-6) / 10

    def y(p: dict) -> float:
        return max(1.0 - p["cosine_median"], floor)

    fig, ax = plt.subplots(figsize=(TEXT_IN, 3.6))
    splits = sorted({p["split"] for p in pairs})
    pts = [p for p in pairs if not p["input_baseline"]]
    if pts:
        sc = ax.scatter([p["bytes_encoded"] for p in pts], [y(p) for p in pts], s=14,
                        c=[p["split"] for p in pts], cmap="viridis", vmin=min(splits),
                        vmax=max(splits), zorder=2, label="(split, transport) pair")
        fig.colorbar(sc, ax=ax, pad=0.01, fraction=0.04).set_label("split point")
    base = [p for p in pairs if p["input_baseline"]]
    if base:
        ax.scatter([p["bytes_encoded"] for p in base], [y(p) for p in base], s=60, marker="*",
                   color="#dd8452", edgecolors="black", linewidths=0.5, zorder=3,
                   label="compressed input (split 0)")
    front = sorted((p for p in pairs if p.get("pareto")), key=lambda p: p["bytes_encoded"])
    ax.plot([p["bytes_encoded"] for p in front], [y(p) for p in front], color=_FRONT_COLOUR,
            linewidth=1.0, zorder=1, label="Pareto front (bytes, cosine)")
    ax.scatter([p["bytes_encoded"] for p in front], [y(p) for p in front], s=70,
               facecolors="none", edgecolors=_FRONT_COLOUR, linewidths=1.0, zorder=4)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _label_apart(ax, fig, [(p["bytes_encoded"], y(p), f"{p['split']} {p['transport']}")
                           for p in front])
    ax.set_xlabel("bytes at the cut (median, encoded)")
    ax.set_ylabel(f"1 - cosine vs the unsplit model\n(median; exact pairs at {floor:.0e})")
    ax.set_title(f"{summary.get('experiment', '')}: bytes against fidelity per (split, "
                 "transport) pair")
    ax.grid(True, which="major", alpha=0.25)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.06), ncol=3, frameon=False)
    caption(fig, summary, load_envs(run_dir), "Labels: split and transport of each pair on "
            "the front")
    return save(fig, run_dir, "rate-fidelity", formats)[0]


def _label_apart(ax, fig, points: list[tuple[float, float, str]], gap_pt: float = 9.0) -> None:
    """Annotate each point, moving a label up or down (with a leader line) while its box
    would overlap one placed before: two pairs at nearly the same place stay legible."""
    fig.canvas.draw()
    placed: list = []
    renderer = fig.canvas.get_renderer()
    for x, yv, text in points:
        for step in (0, 1, -1, 2, -2, 3, -3, 4, -4):
            a = ax.annotate(text, (x, yv), xytext=(5, 3 + step * gap_pt),
                            textcoords="offset points", fontsize=6,
                            arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "#808080"}
                            if step else None)
            box = a.get_window_extent(renderer).expanded(1.02, 1.1)
            if not any(box.overlaps(b) for b in placed):
                placed.append(box)
                break
            a.remove()
        else:
            placed.append(ax.annotate(text, (x, yv), xytext=(5, 3), textcoords="offset points",
                                      fontsize=6).get_window_extent(renderer))
