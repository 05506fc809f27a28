"""Figures of a chain of stages (``stages.csv``): each configuration's latency split by
stage, and the pipeline's timeline in throughput mode."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path

from app_api.results.budget import from_stages
from app_api.results.dispersion import median_interval
from app_api.results.figstyle import COLOURS, COLUMN_IN, TEXT_IN, caption, load_envs, pyplot, save
from app_api.results.store import STAGES_FILE, complete_rows, read_csv

_STAGE_COLOURS = ["#4c72b0", "#55a868", "#8172b2", "#64b5cd", "#937860", "#da8bc3"]


def chain_length(run_dir: Path) -> int:
    """The most stages an inference of the run visited (0 without ``stages.csv``)."""
    hops = [int(r["hop"]) for r in complete_rows(Path(run_dir) / STAGES_FILE)
            if str(r.get("hop", "")).isdigit()]
    return max(hops) + 1 if hops else 0


def config_parts(rows: Iterable[Mapping], stages: Iterable[Mapping]) -> dict[str, dict]:
    """Per configuration (``config`` label, latency mode where measured) the medians of
    each stage's compute (by instance), the codec's time, the transfer and the queue
    wait, the e2e samples and the chain."""
    e2e = {str(r["inference"]): float(r["e2e_ms"]) for r in rows
           if not r.get("error") and r.get("e2e_ms")}
    by_inf: dict[str, list[Mapping]] = {}
    for s in stages:
        if not s.get("error") and str(s.get("inference")) in e2e:
            by_inf.setdefault(str(s["inference"]), []).append(s)
    modes = {s.get("mode") for st in by_inf.values() for s in st}
    mode = "latency" if "latency" in modes else "throughput"
    acc: dict[str, dict] = {}
    for inf, st in by_inf.items():
        st = sorted(st, key=lambda s: int(s["hop"]))
        if st[0].get("mode") != mode or len(st) < 2:
            continue
        parts = from_stages(e2e[inf], st)
        if parts is None:
            continue
        c = acc.setdefault(st[0]["config"], {"chain": [s["instance"] for s in st],
                                             "mode": mode, "samples": {}, "e2e": []})
        c["e2e"].append(e2e[inf])
        vals = {f"compute: {st[0]['instance']}": parts["edge_ms"]}
        for s in st[1:]:
            vals[f"compute: {s['instance']}"] = float(s["t_end_ms"]) - float(s["t_start_ms"])
        vals["encode + decode"] = parts["encode_ms"] + parts["decode_ms"]
        vals["transfer"] = parts["transfer_ms"]
        vals["queue wait"] = parts["queue_ms"]
        for k, v in vals.items():
            c["samples"].setdefault(k, []).append(v)
    return {k: {**c, "medians": {p: statistics.median(v) for p, v in c["samples"].items()}}
            for k, c in acc.items()}


def draw_chain_latency(summary: Mapping, run_dir: Path, formats: Iterable[str] = ("png",)
                       ) -> list[Path]:
    """``latency_per_config``: per configuration of a chain, the medians of each stage's
    compute, the codec, the transfer and the queue wait stacked, and the median end to end
    with its bootstrap 95% interval."""
    run_dir = Path(run_dir)
    configs = config_parts(read_csv(run_dir / "inferences.csv"),
                           complete_rows(run_dir / STAGES_FILE))
    if not configs:
        return []
    plt = pyplot()
    names = sorted(configs, key=lambda k: statistics.median(configs[k]["e2e"]))[:30]
    fig, ax = plt.subplots(figsize=(max(COLUMN_IN, min(TEXT_IN, 1.5 + 0.4 * len(names))), 3.2))
    parts: list[str] = []
    for k in names:
        parts += [p for p in configs[k]["medians"] if p not in parts]
    compute = [p for p in parts if p.startswith("compute")]
    order = compute + [p for p in parts if p not in compute]
    colours = {p: _STAGE_COLOURS[i % len(_STAGE_COLOURS)] for i, p in enumerate(compute)}
    colours.update({"encode + decode": COLOURS["codec"], "transfer": COLOURS["transfer"],
                    "queue wait": COLOURS["queue"]})
    bottom = [0.0] * len(names)
    for p in order:
        h = [max(0.0, configs[k]["medians"].get(p, 0.0)) for k in names]
        ax.bar(range(len(names)), h, 0.6, bottom=bottom, color=colours[p], label=p)
        bottom = [a + b for a, b in zip(bottom, h, strict=True)]
    med = [statistics.median(configs[k]["e2e"]) for k in names]
    ci = [median_interval(configs[k]["e2e"], i) or [m, m] for i, (k, m) in
          enumerate(zip(names, med, strict=True))]
    ax.errorbar(range(len(names)), med, yerr=[[m - c[0] for m, c in zip(med, ci, strict=True)],
                                              [c[1] - m for m, c in zip(med, ci, strict=True)]],
                fmt="o", ms=2.5, color="black", elinewidth=0.8, capsize=2,
                label="end to end: median, bootstrap 95% interval")
    ax.set_xticks(range(len(names)), [f"{k}\n{'>'.join(configs[k]['chain'])}" for k in names],
                  rotation=90 if len(names) > 6 else 0, fontsize=6)
    ax.set_xlabel("configuration (cuts, then the stages in order)")
    ax.set_ylabel("latency (ms)")
    mode = configs[names[0]]["mode"]
    ax.set_title(f"{summary.get('experiment')}: latency per configuration by stage "
                 f"({mode} mode)")
    ax.set_xlim(-0.7, len(names) - 0.3)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.07), ncol=2, frameon=False)
    caption(fig, summary, load_envs(run_dir), "Each stage's compute on its own clock; transfer "
            "is what the head waited that no later stage accounts for")
    return save(fig, run_dir, "latency_per_config", formats)


def draw_timeline(run_dir: Path, window: int = 12, formats: Iterable[str] = ("png",)
                  ) -> list[Path]:
    """``timeline``: the first configuration measured in throughput mode, one row per
    stage, for ``window`` consecutive inferences after the pipeline filled: compute spans
    (solid), sends (hatched) and the idle gaps between them (the bubbles), one colour per
    inference (the key names them). Times are each stage's own clock (one clock in the
    lab), from the first span shown."""
    path = Path(run_dir) / STAGES_FILE
    rows = [r for r in complete_rows(path) if r.get("mode") == "throughput"
            and not r.get("error") and r.get("t_start_ms") and r.get("t_end_ms")]
    if not rows:
        return []
    config = rows[0]["config"]
    rows = [r for r in rows if r["config"] == config]
    ids = sorted({int(r["inference"]) for r in rows})
    skip = min(len(ids) // 4, 4)
    keep = ids[skip: skip + window]
    rows = [r for r in rows if int(r["inference"]) in set(keep)]
    plt = pyplot()
    from matplotlib.patches import Patch

    hops = sorted({int(r["hop"]) for r in rows})
    names = {int(r["hop"]): r["instance"] for r in rows}
    t0 = min(float(r["t_start_ms"]) for r in rows)
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(TEXT_IN, 1.0 + 0.45 * len(hops)))
    for r in rows:
        y = hops.index(int(r["hop"]))
        start, end = float(r["t_start_ms"]) - t0, float(r["t_end_ms"]) - t0
        colour = cmap(keep.index(int(r["inference"])) % 20)
        ax.broken_barh([(start, end - start)], (y - 0.35, 0.7), facecolors=colour)
        if r.get("t_sent_ms") and r.get("send_ms"):
            sent = float(r["t_sent_ms"]) - t0
            ax.broken_barh([(sent - float(r["send_ms"]), float(r["send_ms"]))],
                           (y - 0.35, 0.7), facecolors="none", edgecolors=colour, hatch="////",
                           linewidth=0.6)
    ax.set_yticks(range(len(hops)), [f"stage {h}: {names[h]}" for h in hops])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms, each stage's own clock; one clock in the lab)")
    ax.set_title(f"pipeline timeline of {config} in throughput mode, inferences "
                 f"{keep[0]}-{keep[-1]}")
    handles = [Patch(facecolor=cmap(i % 20), label=f"#{iid}") for i, iid in enumerate(keep)]
    handles += [Patch(facecolor="#cccccc", label="compute"),
                Patch(facecolor="none", edgecolor="#606060", hatch="////", label="send"),
                Patch(facecolor="white", edgecolor="#cccccc", label="gap: idle")]
    ax.legend(handles=handles, title="inference", loc="upper left", bbox_to_anchor=(1.01, 1.0),
              frameon=False, ncol=2 if len(handles) > 10 else 1, title_fontsize=7)
    return save(fig, run_dir, "timeline", formats)
