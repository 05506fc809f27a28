"""Figures of a split sweep, per split point: latency, bytes, per-layer time, memory and
energy, and the best split against bandwidth. Each takes the run's summary and directory
and returns the paths written (none when the run has nothing to draw)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path

from app_api.results.figstyle import COLOURS, TEXT_IN, caption, load_envs, pyplot, save
from app_api.results.store import complete_rows
from app_api.units import parse_rate


def _splits(summary: Mapping) -> list[dict]:
    return [s for s in summary.get("splits") or [] if s.get("e2e_ms_median") is not None]


def _v(s: Mapping, k: str) -> float:
    return float(s.get(k) or 0.0)


def _xticks(ax, splits: list[dict]) -> None:
    ax.set_xticks(range(len(splits)), [f"{s['split']} {s['layer']}" for s in splits],
                  rotation=90, fontsize=6)
    ax.set_xlim(-0.6, len(splits) - 0.4)
    ax.set_xlabel("split point (layers run on the edge, then the node cut after)")


def chosen_splits(summary: Mapping) -> dict[int, str]:
    """Split -> who chose it: the run's partitioner (a decision with ``chosen``) and every
    scored partitioner."""
    out: dict[int, str] = {}
    for inst, part in (summary.get("partitioner") or {}).items():
        dec = (part or {}).get("decision") if isinstance(part, dict) else None
        if isinstance(dec, dict) and dec.get("chosen") is not None:
            out.setdefault(int(dec["chosen"]), f"chosen ({inst})")
    for label, p in (summary.get("partitioners") or {}).items():
        if isinstance(p, dict) and p.get("chosen") is not None and not p.get("error"):
            k = int(p["chosen"])
            out[k] = f"{out[k]}, {label}" if k in out else f"chosen by {label}"
    return out


def best_mark(summary: Mapping, splits: list[dict]) -> tuple[str, list[int]]:
    """How the latency figure marks the best: ``("best", [k])`` when the best split is
    separated from every other, ``("tie", best set)`` when some are tied with it, ``("all
    tied", [])`` when none is separated, ``("none", [])`` without a best."""
    tied = [int(k) for k in (summary.get("best_set") or {}).get("splits") or []]
    shown = {int(s["split"]) for s in splits}
    if len(tied) > 1 and shown <= set(tied):
        return "all tied", []
    if len(tied) > 1:
        return "tie", sorted(tied)
    best = summary.get("best_split")
    return ("best", [int(best)]) if best is not None and int(best) in shown else ("none", [])


def draw_latency(summary: Mapping, run_dir: Path, formats: Iterable[str] = ("png",),
                 envs: Mapping | None = None) -> list[Path]:
    """``latency_per_split``: per split the medians of edge (compute + encode), transfer
    and cloud (decode + compute) stacked, the median end to end as a dot with its
    bootstrap 95% interval, the best split marked, or the best set as a tie, and the
    partitioners' choices."""
    splits = _splits(summary)
    if not splits:
        return []
    plt = pyplot()
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(TEXT_IN, 3.4))
    xs = range(len(splits))
    edge = [_v(s, "edge_ms_median") + _v(s, "encode_ms_median") for s in splits]
    xfer = [_v(s, "transfer_ms_median") for s in splits]
    cloud = [_v(s, "cloud_ms_median") + _v(s, "decode_ms_median") for s in splits]
    ax.bar(xs, edge, 0.7, color=COLOURS["edge"], label="edge: compute + encode")
    ax.bar(xs, xfer, 0.7, bottom=edge, color=COLOURS["transfer"], label="transfer")
    ax.bar(xs, cloud, 0.7, bottom=[a + b for a, b in zip(edge, xfer, strict=True)],
           color=COLOURS["cloud"], label="cloud: decode + compute")
    med = [s["e2e_ms_median"] for s in splits]
    lo = [m - (s.get("e2e_ms_ci95") or [m, m])[0] for m, s in zip(med, splits, strict=True)]
    hi = [(s.get("e2e_ms_ci95") or [m, m])[1] - m for m, s in zip(med, splits, strict=True)]
    ax.errorbar(xs, med, yerr=[lo, hi], fmt="o", ms=2.5, color="black", elinewidth=0.8,
                capsize=2, label="end to end: median, bootstrap 95% interval")
    top = max(m + h for m, h in zip(med, hi, strict=True))
    how, marked = best_mark(summary, splits)
    extra = []
    if how == "all tied":
        extra.append(Patch(facecolor="white", edgecolor="white",
                           label=f"best: none; all {len(splits)} splits tied at 95%"))
    elif how == "tie":
        for i, s in enumerate(splits):
            if s["split"] in marked:
                ax.axvspan(i - 0.45, i + 0.45, color=COLOURS["best"], alpha=0.15, lw=0,
                           zorder=0)
        extra.append(Patch(facecolor=COLOURS["best"], alpha=0.15,
                           label=f"best set: {len(marked)} splits tied at 95%"))
    elif how == "best":
        i = next(i for i, s in enumerate(splits) if s["split"] == marked[0])
        ax.annotate("best", (i, med[i] + hi[i]), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize=7, color=COLOURS["best"])
    for j, (k, who) in enumerate(sorted(chosen_splits(summary).items())):
        i = next((i for i, s in enumerate(splits) if s["split"] == k), None)
        if i is not None:  # a marker over the split, named in the legend
            ax.scatter([i], [med[i] + hi[i] + top * (0.05 + 0.05 * j)], marker="v", s=22,
                       color=COLOURS["chosen"] if j == 0 else "#7f7f7f", zorder=4,
                       label=f"{who}: split {k}")
    ax.set_ylim(0, top * 1.2)
    ax.set_ylabel("latency (ms)")
    _xticks(ax, splits)
    lo_n, hi_n = min(s["count"] for s in splits), max(s["count"] for s in splits)
    ax.set_title(f"{summary.get('experiment')}: latency per split point (medians of "
                 f"{lo_n if lo_n == hi_n else f'{lo_n}-{hi_n}'} inferences each)")
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=handles + extra, loc="lower center", bbox_to_anchor=(0.5, 1.08), ncol=3,
              frameon=False)
    caption(fig, summary, envs, "Bars: medians of each part; their sum need not equal the "
            "end-to-end median")
    return save(fig, run_dir, "latency_per_split", formats)


def draw_bytes(summary: Mapping, run_dir: Path, formats: Iterable[str] = ("png",),
               envs: Mapping | None = None) -> list[Path]:
    """``bytes_per_split``: raw and encoded bytes crossing each cut (log scale, the axis
    fitted to the data)."""
    splits = [s for s in _splits(summary) if (s.get("bytes_raw") or 0) > 0]
    if not splits:
        return []
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(TEXT_IN, 2.8))
    xs = list(range(len(splits)))
    raw = [s.get("bytes_raw") or 0 for s in splits]
    enc = [s.get("bytes_encoded") or 0 for s in splits]
    ax.bar([x - 0.2 for x in xs], raw, 0.4, color="#8172b2", label="raw (tensor bytes)")
    ax.bar([x + 0.2 for x in xs], enc, 0.4, color="#937860", label="encoded (on the wire)")
    ax.set_yscale("log")
    vals = [v for v in raw + enc if v > 0]
    ax.set_ylim(min(vals) / 1.6, max(vals) * 1.6)
    ax.set_ylabel("bytes crossing the cut")
    _xticks(ax, splits)
    ax.set_title(f"{summary.get('experiment')}: bytes sent per inference at each split point")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.06), ncol=2, frameon=False)
    caption(fig, summary, envs, f"Transport: {summary.get('transport_label') or 'as the manifest'}"
            if summary.get("transport_label") else "")
    return save(fig, run_dir, "bytes_per_split", formats)


def layer_medians(layer_rows: Iterable[Mapping]) -> dict[str, dict[int, tuple[str, float]]]:
    """``{device: {layer index: (name, median ms)}}`` from ``layers.csv`` rows."""
    import statistics

    acc: dict[str, dict[int, list[float]]] = {}
    names: dict[int, str] = {}
    rank: dict[str, tuple] = {}  # the edge first, then the stages, the cloud last
    for r in layer_rows:
        try:
            i, ms = int(r["index"]), float(r["ms"])
        except (KeyError, TypeError, ValueError):
            continue
        dev = str(r.get("instance") or r.get("side") or "?")
        side = str(r.get("side") or "")
        rank.setdefault(dev, (0 if side == "edge" else 2 if side == "cloud" else 1, side, dev))
        acc.setdefault(dev, {}).setdefault(i, []).append(ms)
        names[i] = str(r.get("name") or i)
    return {d: {i: (names[i], statistics.median(v)) for i, v in sorted(acc[d].items())}
            for d in sorted(acc, key=lambda d: rank[d])}


def draw_layers(summary: Mapping, run_dir: Path, formats: Iterable[str] = ("png",),
                envs: Mapping | None = None) -> list[Path]:
    """``layers``: each layer's median time on each device that ran it (top) and the
    size of what crosses the cut after it (bottom, log scale)."""
    per = layer_medians(complete_rows(Path(run_dir) / "layers.csv"))
    if not per:
        return []
    plt = pyplot()
    index = sorted({i for d in per.values() for i in d})
    names = {i: n for d in per.values() for i, (n, _) in d.items()}
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(TEXT_IN, 4.6), sharex=True,
                                 gridspec_kw={"height_ratios": [2, 1]})
    width = 0.8 / len(per)
    cmap = [COLOURS["edge"], COLOURS["cloud"], "#8172b2", "#937860", "#da8bc3"]
    for j, (dev, d) in enumerate(per.items()):
        ax.bar([index.index(i) - 0.4 + width * (j + 0.5) for i in d], [ms for _, ms in d.values()],
               width, color=cmap[j % len(cmap)], label=dev)
    ax.set_yscale("log")
    ax.set_ylabel("median time per layer (ms)")
    ax.set_title(f"{summary.get('experiment')}: per-layer time on each device, and the output "
                 "size after each layer", pad=20)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False, ncol=len(per))
    out = {int(s["split"]): s.get("bytes_raw") for s in summary.get("splits") or []}
    sizes = [(index.index(i), out.get(i)) for i in index if out.get(i)]
    if sizes:
        bx.bar([x for x, _ in sizes], [b for _, b in sizes], 0.6, color="#8172b2")
        bx.set_yscale("log")
        vals = [b for _, b in sizes]
        bx.set_ylim(min(vals) / 1.6, max(vals) * 1.6)
    bx.set_ylabel("output (bytes)")
    bx.set_xticks(range(len(index)), [f"{i} {names[i]}" for i in index], rotation=90,
                  fontsize=6)
    bx.set_xlabel("layer (index and graph node)")
    caption(fig, summary, envs, "Output: the raw bytes crossing a cut after the layer")
    return save(fig, run_dir, "layers", formats)


def resource_series(summary: Mapping) -> list[dict]:
    """The memory and energy figures per split that the run measured (summary.json
    ``metrics``, :mod:`app_api.results.metrics`): one series per participant and figure,
    ``{label, unit, values: {split: value}, interval: {split: [lo, hi]}, note}``."""
    out = []
    for inst, doc in sorted((summary.get("metrics") or {}).items(),
                            key=lambda kv: ("edge" not in kv[0], kv[0])):
        if not isinstance(doc, dict):
            continue
        mem = (doc.get("memory") or {}).get("per_split_peak_rss_kb") or {}
        vals = {int(k): v / 1024 for k, v in mem.items() if finite(v)}
        if vals:
            out.append({"label": f"{inst}: peak RSS (axis not from zero)", "unit": "MiB",
                        "values": vals, "points": True,
                        "interval": {}, "note": (doc.get("memory") or {}).get(
                            "per_split_method") or ""})
        for name, per in sorted((doc.get("energy_per_split") or {}).items()):
            vals = {int(k): v["j_per_inference"] for k, v in (per or {}).items()
                    if isinstance(v, dict) and finite(v.get("j_per_inference"))}
            if not vals:
                continue
            first = next(v for v in per.values() if isinstance(v, dict))
            out.append({"label": f"{inst}: energy ({name}, {first.get('label')})",
                        "unit": "J per inference", "values": vals,
                        "interval": {int(k): v.get("interval") for k, v in per.items()
                                     if isinstance(v, dict) and v.get("interval")},
                        "note": f"{name}: {first.get('method')}, {first.get('label')}"})
    for name, per in sorted((summary.get("energy_by_split") or {}).items()):
        vals = {int(k): v["j_per_inference"] for k, v in per.items()
                if isinstance(v, dict) and finite(v.get("j_per_inference"))}
        if vals:
            label = next(iter(per.values())).get("label")
            out.append({"label": f"energy of every participant together ({name}, {label})",
                        "unit": "J per inference", "values": vals,
                        "interval": {int(k): v.get("interval") for k, v in per.items()
                                     if isinstance(v, dict) and v.get("interval")},
                        "note": ""})
    return out


def draw_resources(summary: Mapping, run_dir: Path, formats: Iterable[str] = ("png",),
                   envs: Mapping | None = None) -> list[Path]:
    """``resources``: each participant's peak memory and energy per inference per split
    (one panel each, energy with its interval), when the run measured them."""
    series = resource_series(summary)
    splits = _splits(summary)
    if not series or not splits:
        return []
    plt = pyplot()
    fig, axes = plt.subplots(len(series), 1, figsize=(TEXT_IN, 1.4 + 1.4 * len(series)),
                             sharex=True, squeeze=False)
    for ax, ser in zip(axes[:, 0], series, strict=True):
        ks = [int(s["split"]) for s in splits]
        h = [ser["values"].get(k) for k in ks]
        iv = [ser["interval"].get(k) for k in ks]
        colour = ("#8172b2" if ser["label"].startswith("energy of every") else
                  COLOURS["cloud"] if "cloud" in ser["label"] else COLOURS["edge"])
        xs = [i for i, v in enumerate(h) if v is not None]
        if ser.get("points"):  # a process's peak: the differences between splits matter
            ys = [v for v in h if v is not None]
            ax.plot(xs, ys, "o-", ms=3, lw=0.8, color=colour)
            # at least 2% of the value on the axis: a 0.05 MiB step must not look like a cliff
            mid, half = (max(ys) + min(ys)) / 2, max(max(ys) - min(ys), 0.02 * max(ys)) * 0.75
            ax.set_ylim(mid - half, mid + half)
            ax.ticklabel_format(axis="y", style="plain", useOffset=False)
        else:
            ax.bar(xs, [v for v in h if v is not None], 0.7, color=colour)
        err = [(i, v, b) for i, (v, b) in enumerate(zip(h, iv, strict=True)) if v and b]
        if err:
            ax.errorbar([i for i, _, _ in err], [v for _, v, _ in err],
                        yerr=[[v - b[0] for _, v, b in err], [b[1] - v for _, v, b in err]],
                        fmt="none", color="black", elinewidth=0.8, capsize=2)
        ax.set_ylabel(ser["unit"])
        ax.set_title(ser["label"], loc="left", fontsize=7)
    _xticks(axes[-1, 0], splits)
    fig.subplots_adjust(hspace=0.45)
    fig.suptitle(f"{summary.get('experiment')}: memory and energy per split point", y=0.99)
    caption(fig, summary, envs, "; ".join(dict.fromkeys(s["note"] for s in series if s["note"])))
    return save(fig, run_dir, "resources", formats)


def best_against_bandwidth(summary: Mapping, rates_Bps: list[float]) -> list[tuple[float, int]]:
    """The split with the lowest ``edge + encode + decode + cloud`` medians + encoded bytes /
    rate at each rate (the measured compute, the wire at that rate)."""
    out = []
    for rate in rates_Bps:
        def total(s: Mapping, rate: float = rate) -> float:
            return (_v(s, "edge_ms_median") + _v(s, "encode_ms_median") + _v(s, "decode_ms_median")
                    + _v(s, "cloud_ms_median") + 1e3 * _v(s, "bytes_encoded") / rate)

        splits = _splits(summary)
        if splits:
            out.append((rate, int(min(splits, key=total)["split"])))
    return out


def draw_bandwidth(summary: Mapping, run_dir: Path, formats: Iterable[str] = ("png",),
                   envs: Mapping | None = None, group: Mapping | None = None) -> list[Path]:
    """``best_vs_bandwidth``: the best split at each link rate. A bandwidth group: each
    rate's measured best split (and each scored partitioner's choice); one run: the split
    its measured compute medians and bytes would make best at rates from 0.1 to 1000 MB/s
    (the wire's time estimated as bytes / rate), the rate it ran at marked."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(TEXT_IN / 2, 2.6))
    if group is not None:
        rows = [r for r in group.get("rows") or [] if r.get("best") is not None]
        if not rows:
            plt.close(fig)
            return []
        pts = sorted((parse_rate(r["bandwidth"]), int(r["best"]), r) for r in rows)
        ax.plot([p[0] / 1e6 for p in pts], [p[1] for p in pts], "o-", color=COLOURS["best"],
                label="measured best", ms=4)
        labels = sorted({k for r in rows for k in (r.get("partitioners") or {})})
        for j, label in enumerate(labels):
            xy = [(p[0] / 1e6, (p[2]["partitioners"][label] or {}).get("chosen")) for p in pts
                  if label in (p[2].get("partitioners") or {})]
            xy = [(x, y) for x, y in xy if y is not None]
            ax.scatter([x for x, _ in xy], [y for _, y in xy], marker="x^sv"[j % 4], s=18,
                       label=f"chosen by {label}", zorder=3)
        title, note = f"{group.get('experiment')}: best split against bandwidth", "Measured"
    else:
        rates = [10 ** (e / 8) * 1e5 for e in range(0, 33)]
        pts = best_against_bandwidth(summary, rates)
        if not pts:
            plt.close(fig)
            return []
        ax.step([r / 1e6 for r, _ in pts], [k for _, k in pts], where="mid",
                color=COLOURS["best"], label="best (measured compute + bytes / rate)")
        net = summary.get("network") or {}
        ran = (net.get("lab") or {}).get("bandwidth_Bps") or next(
            (v.get("bandwidth_Bps") for k, v in net.items() if k != "lab" and isinstance(v, dict)
             and v.get("bandwidth_Bps")), None)
        if ran:
            ax.axvline(ran / 1e6, color="black", lw=0.8, ls="--", label="measured link")
        title = f"{summary.get('experiment')}: best split against bandwidth"
        note = ("Estimated from this run: each split's measured compute and codec medians "
                "plus its encoded bytes / rate")
    ax.set_xscale("log")
    ax.set_xlabel("link rate (MB/s)")
    ax.set_ylabel("best split point")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title(title)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.1), frameon=False, ncol=1)
    caption(fig, summary, envs, note)
    return save(fig, run_dir, "best_vs_bandwidth", formats)


def draw_split_figures(summary: Mapping, run_dir: Path, formats: Iterable[str] = ("png",)
                       ) -> list[Path]:
    """Every per-split figure that applies to a two-party run."""
    envs = load_envs(run_dir)
    paths: list[Path] = []
    for draw in (draw_latency, draw_bytes, draw_layers, draw_resources, draw_bandwidth):
        paths += draw(summary, run_dir, formats, envs)
    return paths


def finite(v) -> bool:
    """A number that is neither None nor NaN nor infinite."""
    return isinstance(v, (int, float)) and math.isfinite(v)
