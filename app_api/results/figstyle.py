"""How tracr's figures look and are saved: 300 dpi, a paper's text width, a caption.

A figure is drawn at :data:`TEXT_IN` (a two-column paper's text width) or
:data:`COLUMN_IN` (one column) with 8-point text, so it reads at the size it is printed;
:func:`save` writes it atomically as PNG (300 dpi), SVG or PDF with a tight bounding box
(no label cut off). :func:`caption` says which devices measured it and the measured link.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from app_api.fsutil import atomic_write

DPI = 300
FORMATS = ("png", "svg", "pdf")
COLUMN_IN = 3.5
TEXT_IN = 7.0
#: edge / transfer / cloud, and the marks, the same in every figure
COLOURS = {"edge": "#4c72b0", "transfer": "#dd8452", "cloud": "#55a868", "queue": "#8c8c8c",
           "codec": "#c9a227", "best": "#c44e52", "chosen": "#000000"}
_RC = {"font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "xtick.labelsize": 7,
       "ytick.labelsize": 7, "legend.fontsize": 7, "figure.titlesize": 9,
       "axes.spines.top": False, "axes.spines.right": False}


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend with tracr's style (imported when drawing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams.update(_RC)
    return plt


def save(fig: Any, run_dir: Path, name: str, formats: Iterable[str] = ("png",)) -> list[Path]:
    """Write ``plots/<name>.<fmt>`` for each format (atomically), close the figure and
    return the paths."""
    _place_caption(fig)
    out_dir = Path(run_dir) / "plots"
    out_dir.mkdir(exist_ok=True)
    paths = []
    for fmt in formats:
        if fmt not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=DPI, bbox_inches="tight", pad_inches=0.04,
                    metadata={"Date": None} if fmt in ("svg", "pdf") else None)
        paths.append(atomic_write(out_dir / f"{name}.{fmt}", buf.getvalue()))
    import matplotlib.pyplot as plt

    plt.close(fig)
    return paths


def link_text(summary: Mapping) -> str:
    """The measured link in words: the lab's shaped and measured rate, or the probe's."""
    net = summary.get("network") or {}
    lab = net.get("lab") or {}
    if lab.get("bandwidth_Bps"):
        conf = (lab.get("configured") or {}).get("bandwidth") or "unshaped"
        return (f"lab link shaped to {conf}, measured {lab['bandwidth_Bps'] / 1e6:.2f} MB/s, "
                f"rtt {lab.get('rtt_ms') or 0:.2f} ms")
    probes = [v for k, v in net.items() if k != "lab" and isinstance(v, dict)
              and v.get("bandwidth_Bps")]
    if probes:
        p = probes[0]
        return (f"link probed at {p['bandwidth_Bps'] / 1e6:.1f} MB/s, rtt "
                f"{p.get('rtt_ms') or 0:.2f} ms (unshaped)")
    return "link not measured"


def devices_text(envs: Mapping | None) -> str:
    """``edge-1 on vm (Intel Xeon, cpu, 1 thread)``, one per participant."""
    parts = []
    for inst, e in (envs or {}).items():
        if not isinstance(e, dict):
            continue
        where = e.get("device_name") or e.get("hostname") or "?"
        cpu = str(e.get("cpu_model") or "").replace("(R)", "").replace("Processor", "").strip()
        threads = e.get("threads")
        what = ", ".join(x for x in (cpu, str(e.get("accelerator") or e.get("device") or ""),
                                     f"{threads} thread{'s' if threads != 1 else ''}"
                                     if threads else "") if x)
        parts.append(f"{inst} on {where} ({what})")
    return "; ".join(parts)


def caption(fig: Any, summary: Mapping, envs: Mapping | None, extra: str = "") -> None:
    """A caption under the figure (placed by :func:`save`, below every label): model,
    devices, the measured link, ``extra``."""
    head = f"{summary.get('model')} ({summary.get('weights')} weights)"
    fig._tracr_caption = ". ".join(
        x for x in (head, devices_text(envs), link_text(summary), extra) if x) + "."


def _place_caption(fig: Any) -> None:
    """Put the figure's caption under its tight bounding box, wrapped to its width."""
    import textwrap

    text = getattr(fig, "_tracr_caption", None)
    if not text:
        return
    fig.canvas.draw()
    box = fig.get_tightbbox(fig.canvas.get_renderer())  # inches
    w, h = fig.get_size_inches()
    width = max(40, int(box.width * 19))  # characters of 6.5-point text per inch
    fig.text(box.x0 / w, (box.y0 - 0.06) / h, textwrap.fill(text, width), fontsize=6.5,
             color="#404040", ha="left", va="top")


def load_envs(run_dir: Path) -> dict:
    """environment.json of a run (participant -> environment), {} when missing."""
    import json

    try:
        data = json.loads((Path(run_dir) / "environment.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
