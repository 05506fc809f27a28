"""``report.html``: one self-contained page per run, readable offline in any browser.

Every figure is embedded (PNG as a data URI), the style is inline, and nothing is fetched
from the network: the page can be mailed, archived or opened on a plane. It holds the
summary tables (per split: p50, p90, p99 and the bootstrap interval of the median), the
latency budget, the partitioners' decisions and scores, the measured link, each
participant's environment, the metrics with their methods, and the resolved manifest.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from app_api.fsutil import atomic_write
from app_api.results.figstyle import DPI, devices_text, link_text, load_envs
from app_api.results.store import load_summary

REPORT_FILE = "report.html"

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;
max-width:1100px;padding:0 1em;color:#222}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.2em;border-bottom:1px solid #ccc;
padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0;font-size:12.5px}
th,td{border:1px solid #ddd;padding:2px 7px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}
tr.best td{background:#eaf5ea;font-weight:600}tr.tie td{background:#f4faf4}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:12px;color:#555}
pre{background:#f7f7f7;padding:.7em;overflow:auto;font-size:12px;max-height:40em}
.meta{color:#555}.bad{color:#b00;font-weight:600}.ok{color:#070;font-weight:600}
"""


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _n(v: Any, nd: int = 2) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return _e(v)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
          row_class: Iterable[str] | None = None, left: int = 0) -> str:
    """An HTML table; the first ``left`` columns left-aligned (text)."""
    classes = list(row_class or [])
    out = ["<table><thead><tr>"]
    out += [f'<th class="{"l" if i < left else ""}">{_e(h)}</th>' for i, h in enumerate(headers)]
    out.append("</tr></thead><tbody>")
    for j, r in enumerate(rows):
        cls = classes[j] if j < len(classes) else ""
        out.append(f'<tr class="{cls}">' + "".join(
            f'<td class="{"l" if i < left else ""}">{c if isinstance(c, _Raw) else _n(c)}</td>'
            for i, c in enumerate(r)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


class _Raw(str):
    """HTML already escaped (a cell that is markup)."""


def _ci(v: Any) -> str:
    return "-" if not v else f"{v[0]:.2f} – {v[1]:.2f}"


def splits_section(summary: Mapping) -> str:
    """Per split: count, p50/p90/p99, the bootstrap interval, the parts, bytes."""
    splits = summary.get("splits") or []
    if not splits:
        return "<p>No split was measured.</p>"
    best = summary.get("best_split")
    tied = set((summary.get("best_set") or {}).get("splits") or [])
    rows, classes = [], []
    for s in splits:
        mark = "best" if s["split"] == best else ("tie" if s["split"] in tied else "")
        classes.append(mark)
        rows.append([s["split"], s.get("layer"), s.get("count"), s.get("failed"),
                     s.get("e2e_ms_p50", s.get("e2e_ms_median")), s.get("e2e_ms_p90"),
                     s.get("e2e_ms_p99"), _ci(s.get("e2e_ms_ci95")),
                     _sum(s, "edge_ms_median", "encode_ms_median"), s.get("transfer_ms_median"),
                     _sum(s, "cloud_ms_median", "decode_ms_median"), s.get("bytes_raw"),
                     s.get("bytes_encoded"), {"best": "best", "tie": "~best"}.get(mark, "")])
    head = ["split", "layer", "n", "failed", "p50 ms", "p90 ms", "p99 ms", "95% ci of median",
            "edge ms", "transfer ms", "cloud ms", "bytes raw", "bytes sent", ""]
    bs = summary.get("best_set") or {}
    note = ""
    if bs:
        note = (f"<p>Best split {_e(bs.get('best'))}; not separated from it at "
                f"{bs.get('confidence', 0.95):.0%}: {_e(', '.join(map(str, bs.get('splits') or [])))}"
                f" (~best). Method: {_e(bs.get('method'))}.</p>")
    return table(head, rows, classes, left=2) + note + (
        "<p class='meta'>edge = prefix compute + encode; cloud = decode + suffix compute; "
        "p50/p90/p99: linear-interpolated percentiles of the successful inferences; "
        "the interval: bootstrap of the median (1000 resamples, seeded).</p>")


def _sum(s: Mapping, a: str, b: str) -> float | None:
    if s.get(a) is None and s.get(b) is None:
        return None
    return float(s.get(a) or 0.0) + float(s.get(b) or 0.0)


def budget_section(summary: Mapping) -> str:
    """The latency budget's worst residual and the warm-up that was left out."""
    b = summary.get("latency_budget")
    out = []
    if b:
        verdict = ("<span class='ok'>adds up</span>" if b.get("adds_up") else
                   f"<span class='bad'>{b.get('over_tolerance')} of them above "
                   f"{b.get('tolerance_pct'):g}%</span>")
        out.append(f"<p>Worst residual {b['worst_residual_pct']:.2f}% of e2e (inference "
                   f"{_e(b.get('worst_inference'))}), median {b['median_residual_pct']:.3f}%, "
                   f"over {b['inferences']} inferences: {verdict} (source: {_e(b.get('source'))})."
                   "</p>")
        parts = b.get("parts_ms_median") or {}
        out.append(table(list(parts), [[parts[k] for k in parts]]))
        out.append(f"<p class='meta'>{_e(b.get('method'))}</p>")
    w = summary.get("warmup")
    if w:
        out.append(f"<p>Warm-up: {_e(w.get('inferences'))} inferences excluded "
                   f"({_e(w.get('method'))}).</p>")
    return "".join(out) or "<p>Not computed for this run.</p>"


def partitioners_section(summary: Mapping) -> str:
    """The run's partitioner decision and the scored partitioners."""
    out = []
    for inst, part in (summary.get("partitioner") or {}).items():
        dec = (part or {}).get("decision") if isinstance(part, dict) else part
        if not isinstance(dec, dict):
            continue
        rows = [[k, _Raw(f"<code>{_e(_short(v))}</code>")] for k, v in dec.items()]
        out.append(f"<h3>decision of {_e(inst)}'s partitioner</h3>"
                   + table(["", "value"], rows, left=2))
    parts = summary.get("partitioners") or {}
    if parts:
        rows = [[label, p.get("chosen"), p.get("chosen_ms"), p.get("best"), p.get("best_ms"),
                 p.get("regret"), "yes" if p.get("tie") else "", p.get("spearman"),
                 None if p.get("within_10pct") is None else f"{100 * p['within_10pct']:.0f}%",
                 p.get("error") or p.get("criterion")] for label, p in parts.items()]
        out.append("<h3>scored against this sweep</h3>" + table(
            ["partitioner", "chosen", "chosen ms", "best", "best ms", "regret", "tie",
             "spearman", "within 10%", "note"], rows, left=1))
        out.append("<p class='meta'>regret = chosen ms / best ms; tie: the choice is in the "
                   "best set; spearman: rank correlation of predicted and measured medians; "
                   "within 10%: share of splits whose predicted latency is within 10% of the "
                   "measured median (nn-Meter's figure of merit).</p>")
    return "".join(out) or "<p>No partitioner decision recorded.</p>"


def _short(v: Any, limit: int = 400) -> str:
    text = v if isinstance(v, str) else json.dumps(v, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def environment_section(envs: Mapping) -> str:
    """One column per participant: python, torch, device, CPU, threads, host."""
    if not envs:
        return "<p>No environment.json.</p>"
    keys = ["role", "device_name", "host_label", "hostname", "platform", "python", "torch",
            "tracr", "git_commit", "device", "accelerator", "cpu_model", "cores", "threads"]
    insts = [i for i, e in envs.items() if isinstance(e, dict)]
    rows = [[k, *(envs[i].get(k) for i in insts)] for k in keys
            if any(envs[i].get(k) not in (None, "") for i in insts)]
    return table(["", *insts], rows, left=len(insts) + 1)


#: the figures' order on the page (others follow by name)
_ORDER = ("latency_per_split", "latency_per_config", "bytes_per_split", "layers", "resources",
          "best_vs_bandwidth", "pareto", "rate-fidelity", "timeline", "adaptive")


def _png_width_px(data: bytes) -> int | None:
    """A PNG's width in pixels (its IHDR chunk), None if it is not one."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or len(data) < 24:
        return None
    return int.from_bytes(data[16:20], "big")


def figures_section(run_dir: Path) -> str:
    """Every PNG under ``plots/``, embedded at its printed size (300 dpi drawn, 96 css px
    to the inch shown)."""
    out = []
    files = sorted((Path(run_dir) / "plots").glob("*.png"),
                   key=lambda p: (_ORDER.index(p.stem) if p.stem in _ORDER else 99, p.stem))
    for p in files:
        raw = p.read_bytes()
        px = _png_width_px(raw)
        width = f' style="width:{round(px / DPI * 96 * 1.25)}px"' if px else ""
        data = base64.b64encode(raw).decode("ascii")
        out.append(f'<figure id="fig-{_e(p.stem)}"><img alt="{_e(p.stem)}"{width} '
                   f'src="data:image/png;base64,{data}"><figcaption>plots/{_e(p.name)}'
                   "</figcaption></figure>")
    return "".join(out) or "<p>No figure was drawn.</p>"


def metrics_section(summary: Mapping) -> str:
    """Memory, CPU and energy per participant with their methods (as recorded)."""
    m = summary.get("metrics")
    extra = {k: summary[k] for k in ("machine_drift", "measurement_noise") if summary.get(k)}
    if not m and not extra:
        return "<p>The run recorded no memory, CPU or energy metrics.</p>"
    return f"<pre>{_e(json.dumps({'metrics': m, **extra}, indent=1, default=str))}</pre>"


def build_report(run_dir: Path, summary: Mapping | None = None) -> str:
    """The page's HTML for the run in ``run_dir``."""
    run_dir = Path(run_dir)
    summary = summary if summary is not None else (load_summary(run_dir) or {})
    envs = load_envs(run_dir)
    manifest = run_dir / "manifest.yaml"
    title = f"{summary.get('experiment')} / {summary.get('run_id')}"
    status = summary.get("status")
    inc = (summary.get("incomplete") or {}).get("reason")
    body = [
        f"<h1>{_e(title)}</h1>",
        f"<p class='meta'>{_e(summary.get('model'))} ({_e(summary.get('weights'))} weights), "
        f"status <b>{_e(status)}</b>{' (' + _e(inc) + ')' if inc else ''}; "
        f"{_e(summary.get('inferences'))} inferences, {_e(summary.get('failed'))} failed; wall "
        f"{_n(summary.get('wall_s'))} s.</p>",
        f"<p>Devices: {_e(devices_text(envs))}.<br>Link: {_e(link_text(summary))}.</p>",
        "<h2 id='splits'>Per split point</h2>", splits_section(summary),
        "<h2 id='budget'>Latency budget</h2>", budget_section(summary),
        "<h2 id='partitioners'>Partitioners</h2>", partitioners_section(summary),
        "<h2 id='figures'>Figures</h2>", figures_section(run_dir),
        "<h2 id='link'>Measured link</h2>",
        f"<pre>{_e(json.dumps(summary.get('network'), indent=1, default=str))}</pre>",
        "<h2 id='environment'>Environment of each participant</h2>", environment_section(envs),
        "<h2 id='metrics'>Metrics and their methods</h2>", metrics_section(summary),
        "<h2 id='manifest'>Manifest</h2>",
        f"<pre>{_e(manifest.read_text() if manifest.exists() else 'not recorded')}</pre>",
    ]
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
            + "".join(body) + "</body></html>\n")


def write_report(run_dir: Path, summary: Mapping | None = None) -> Path:
    """Write ``report.html`` into the run directory (atomically) and return its path."""
    return atomic_write(Path(run_dir) / REPORT_FILE, build_report(run_dir, summary))
