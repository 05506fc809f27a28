"""Plots of a run (matplotlib, Agg backend, imported only when drawing)."""

from __future__ import annotations

from pathlib import Path


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
