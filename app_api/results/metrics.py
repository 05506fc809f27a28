"""What the participants' samplers measured: ``metrics.csv`` and summary.json ``metrics``.

Each participant samples itself off the timed path (``experiment_design.runtime.sampler``)
and its samples come back with every poll. Here they are written to ``metrics.csv`` (one
row per sample and participant) and summarised per participant over the window of the
run's inferences (the first inference's start to the last one's end, on the head's wall
clock, which the participants share on one machine and in the lab):

- ``memory``: the peak RSS of the run, per split the peak over the samples whose
  interval overlaps that split's inferences (``per_split_method`` says whether that is
  the exact high-water mark of each interval or the largest sampled RSS), CUDA's peak;
- ``cpu``: utilization (cores and share of the participant's CPUs) and frequency;
- ``throttling``: the cgroup's throttled periods and time over the window, per inference;
- ``energy``: per collector, joules per inference with an interval, or ``unsupported``
  with the reason, or ``insufficient`` (fewer than 20 samples); ``energy_per_split`` the
  same per split where its inferences span enough samples;
- ``reference``: the reference workload's timings at set-up and after each task, and
  ``drift_pct``, how far the machine's own speed moved between them.

summary.json ``machine_drift`` holds the largest drift of any participant: a difference
between runs, or between splits, smaller than it may be the machine, not the layers.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app_api.fsutil import atomic_write
from app_api.results.drift import drift_flag
from app_api.results.energy import energy_by_split
from experiment_design.energy import integrate
from experiment_design.energy.window import MIN_SAMPLES, combine
from experiment_design.protocol import METRIC_COLUMNS, MetricSample, SamplerFacts
from experiment_design.runtime import procstat

METRICS_FILE = "metrics.csv"


class MetricsLog:
    """The samples and sampler facts of every participant, as the polls bring them."""

    def __init__(self) -> None:
        self.samples: dict[str, list[MetricSample]] = defaultdict(list)
        self.info: dict[str, SamplerFacts] = {}
        #: a participant's host cgroup ``cpu.stat`` the observer reads (a lab host, whose
        #: participant cannot), and what it read at each poll
        self.host_stat: dict[str, Path | None] = {}
        self.host_throttle: dict[str, list[dict]] = defaultdict(list)

    def add(self, instance: str, samples: list[MetricSample], info: SamplerFacts | None,
            host_stat: Callable[[], Path | None] | None = None) -> None:
        """Keep one poll's samples and, when sent, the sampler's facts; ``host_stat`` finds
        (once) the participant's host cgroup ``cpu.stat`` for the observer to read now."""
        self.samples[instance].extend(samples)
        if info:
            self.info[instance] = info
        if instance not in self.host_stat:
            self.host_stat[instance] = host_stat() if host_stat is not None else None
        path = self.host_stat[instance]
        if path is not None:
            n, us = procstat.throttled(path)
            if us is not None:
                self.host_throttle[instance].append(
                    {"t_unix": time.time(), "nr_throttled": n, "throttled_us": us})

    def __bool__(self) -> bool:
        return bool(self.info) or any(self.samples.values())

    def columns(self) -> list[str]:
        """The CSV's columns: ``METRIC_COLUMNS`` (``experiment_design.protocol``), then every
        energy column seen."""
        extra = sorted({k for rows in self.samples.values() for r in rows for k in r}
                       - set(METRIC_COLUMNS))
        return METRIC_COLUMNS + extra

    def rows(self) -> list[dict]:
        """Every sample, with its participant, in time order per participant."""
        return [{"instance": inst, **r} for inst, rows in sorted(self.samples.items())
                for r in rows]


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    pts = [(r["t_unix"], float(r[key])) for r in rows if r.get(key) is not None]
    return [t for t, _ in pts], [v for _, v in pts]


def _window(infer_rows: list[dict]) -> tuple[float, float, int] | None:
    """(start, end, inferences) of the measured inferences; None without their times."""
    spans = _spans(infer_rows)
    if not spans:
        return None
    return min(a for a, _, _ in spans), max(b for _, b, _ in spans), len(spans)


def _spans(infer_rows: list[dict]) -> list[tuple[float, float, Any]]:
    out = []
    for r in infer_rows:
        if r.get("error") or r.get("t_unix") in (None, "") or r.get("e2e_ms") in (None, ""):
            continue
        t = float(r["t_unix"])
        out.append((t, t + float(r["e2e_ms"]) / 1e3, r.get("split")))
    return out


def _blocks(spans: list[tuple[float, float, Any]]) -> dict[Any, list[tuple[float, float, int]]]:
    """Per split, its consecutive inferences merged into blocks (start, end, count)."""
    out: dict[Any, list[list]] = defaultdict(list)
    last = None
    for a, b, split in sorted(spans, key=lambda s: s[0]):
        if split == last and out[split]:
            out[split][-1][1] = max(out[split][-1][1], b)
            out[split][-1][2] += 1
        else:
            out[split].append([a, b, 1])
        last = split
    return {k: [tuple(v) for v in blocks] for k, blocks in out.items()}


def _memory(rows: list[dict], info: dict, spans: list) -> dict:
    exact = info.get("peak_method") == "VmHWM reset per sample"
    key = "hwm_kb" if exact else "rss_kb"
    peaks = [r["hwm_kb"] for r in rows if r.get("hwm_kb") is not None]
    out: dict[str, Any] = {
        "peak_rss_kb": max(peaks) if peaks else max((r["rss_kb"] for r in rows
                                                     if r.get("rss_kb") is not None),
                                                    default=None),
        "source": (info.get("sources") or {}).get("memory"),
        "per_split_method": (info.get("peak_method") or "sampled VmRSS") + (
            f", {info.get('interval_ms', 50):.0f} ms samples overlapping the split's "
            "inferences"),
    }
    per: dict[str, int] = {}
    prev_t = None
    for r in rows:
        v = r.get(key)
        t = r["t_unix"]
        lo = prev_t if (exact and prev_t is not None) else t
        prev_t = t
        if v is None:
            continue
        for a, b, split in spans:
            if a <= t and b >= lo:
                k = str(split)
                per[k] = max(per.get(k, 0), v)
    out["per_split_peak_rss_kb"] = dict(sorted(per.items(), key=lambda kv: _num(kv[0])))
    cuda = [r["cuda_peak_bytes"] for r in rows if r.get("cuda_peak_bytes") is not None]
    if cuda:
        out["cuda_peak_allocated_bytes"] = max(cuda)
    return out


def _num(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return float("inf")


def _cpu(rows: list[dict], info: dict, t0: float, t1: float) -> dict:
    inside = [r for r in rows if t0 <= r["t_unix"] <= t1]
    out: dict[str, Any] = {"source": (info.get("sources") or {}).get("cpu")}
    if len(inside) >= 2 and inside[-1]["t_unix"] > inside[0]["t_unix"]:
        cores = (inside[-1]["cpu_s"] - inside[0]["cpu_s"]) / (
            inside[-1]["t_unix"] - inside[0]["t_unix"])
        out.update(utilization_cores=round(cores, 3),
                   utilization_share=round(cores / max(1, info.get("cpus") or 1), 3))
    freqs = [r["freq_mhz"] for r in inside if r.get("freq_mhz") is not None]
    out["frequency"] = ({"mean_mhz": round(sum(freqs) / len(freqs), 1), "min_mhz": min(freqs),
                         "max_mhz": max(freqs),
                         "source": (info.get("sources") or {}).get("frequency")}
                        if freqs else {"status": "unavailable"})
    return out


def _throttling(rows: list[dict], info: dict, t0: float, t1: float, n: int,
                host: list[dict] | None = None, host_path: Path | None = None) -> dict:
    src = (info.get("sources") or {}).get("throttling")
    pts = [r for r in rows if r.get("throttled_us") is not None]
    if not pts and host:  # a lab host: the observer read its cgroup
        pts, src = host, f"observer: {host_path} (the lab host's cgroup)"
    if not pts:
        return {"status": "unavailable", "source": src or "none"}
    before = [r for r in pts if r["t_unix"] <= t0] or pts[:1]
    after = [r for r in pts if r["t_unix"] >= t1] or pts[-1:]
    us = after[0]["throttled_us"] - before[-1]["throttled_us"]
    periods = (after[0].get("nr_throttled") or 0) - (before[-1].get("nr_throttled") or 0)
    return {"source": src, "nr_throttled": periods, "throttled_ms": round(us / 1e3, 3),
            "throttled_ms_per_inference": round(us / 1e3 / n, 3) if n else None,
            "window_s": round(after[0]["t_unix"] - before[-1]["t_unix"], 3)}


def _energy(rows: list[dict], info: dict, t0: float, t1: float, n: int,
            blocks: dict) -> tuple[dict, dict]:
    whole: dict[str, dict] = {}
    per_split: dict[str, dict] = {}
    for name, probe in (info.get("energy") or {}).items():
        label = probe.get("label", "measured")
        facts = {k: v for k, v in probe.items() if k not in ("status", "reason", "detail")}
        if probe.get("status") != "supported":
            whole[name] = {**facts, "status": "unsupported",
                           "reason": probe.get("reason", "unsupported on this device")}
            continue
        col = next((f"{name}_{u}" for u in ("j", "w") if any(f"{name}_{u}" in r for r in rows)),
                   None)
        if col is None:
            whole[name] = {**facts, "status": "insufficient", "reason": "no readings"}
            continue
        kind = "counter" if col.endswith("_j") else "power"
        ts, vs = _series(rows, col)
        fig = integrate(ts, vs, kind, t0, t1, method=probe.get("method", name), label=label)
        whole[name] = {**facts, **fig.per(n)}
        splits = {}
        for split, bl in blocks.items():
            parts = [integrate(ts, vs, kind, a, b, method=fig.method, label=label,
                               min_samples=0) for a, b, _ in bl]
            splits[str(split)] = combine(parts, min_samples=MIN_SAMPLES).per(
                sum(c for _, _, c in bl))
        per_split[name] = splits
    return whole, per_split


def _reference(info: dict) -> dict:
    runs = ((info.get("reference") or {}).get("runs")) or []
    out: dict[str, Any] = {"work": (info.get("reference") or {}).get("work"), "runs": runs}
    ms = [r["ms"] for r in runs if r.get("ms")]
    if len(ms) >= 2:
        out["drift_pct"] = round((max(ms) / min(ms) - 1) * 100, 2)
        out["end_over_start"] = round(ms[-1] / ms[0], 4)
    return out


def model_memory(profile: list[dict] | None) -> dict[str, Any] | None:
    """summary.json ``model_memory``: per cut k the activation bytes alive once layer k has
    run (the model profile's ``activation_bytes``, what ``tracr model splits`` reports as
    crossing bytes) and the parameters' bytes up to k (the paper's memory term)."""
    if not profile:
        return None
    acts = {str(r["index"]): r.get("activation_bytes", r.get("crossing_bytes"))
            for r in profile}
    cum, params = 0, {}
    for r in profile:
        cum += int(r.get("param_bytes") or 0)
        params[str(r["index"])] = cum
    return {"activation_bytes": acts, "cum_param_bytes": params, "param_bytes": cum}


def metrics_summary(log: MetricsLog, infer_rows: list[dict],
                    profile: list[dict] | None = None,
                    devices: dict[str, str] | None = None) -> dict[str, Any]:
    """summary.json ``metrics`` (per participant), ``machine_drift`` and ``model_memory``
    (from the model ``profile``); {} without samples."""
    mem = model_memory(profile)
    if not log:
        return {"model_memory": mem} if mem else {}
    spans = _spans(infer_rows)
    win = _window(infer_rows)
    blocks = _blocks(spans)
    per: dict[str, dict] = {}
    for inst in sorted(set(log.samples) | set(log.info)):
        rows = sorted(log.samples.get(inst, []), key=lambda r: r["t_unix"])
        info = log.info.get(inst, {})
        if win is None and rows:
            t0, t1, n = rows[0]["t_unix"], rows[-1]["t_unix"], 0
        elif win is None:
            t0 = t1 = 0.0
            n = 0
        else:
            t0, t1, n = win
        doc: dict[str, Any] = {"samples": len(rows), "interval_ms": info.get("interval_ms"),
                               "dropped": info.get("dropped", 0), "inferences": n,
                               "window_s": round(t1 - t0, 3)}
        doc["memory"] = _memory(rows, info, spans)
        doc["cpu"] = _cpu(rows, info, t0, t1)
        doc["throttling"] = _throttling(rows, info, t0, t1, n, log.host_throttle.get(inst),
                                        log.host_stat.get(inst))
        doc["energy"], doc["energy_per_split"] = _energy(rows, info, t0, t1, n, blocks)
        doc["reference"] = _reference(info)
        per[inst] = doc
    drifts = {i: d["reference"]["drift_pct"] for i, d in per.items()
              if "drift_pct" in d["reference"]}
    out: dict[str, Any] = {"metrics": per}
    by_split = energy_by_split(per, devices)
    if by_split:
        out["energy_by_split"] = by_split
    if mem:
        out["model_memory"] = mem
    if drifts:
        out["machine_drift"] = {
            "max_pct": max(drifts.values()), "by_instance": drifts,
            "note": "the reference workload's time moved this much between the run's start "
                    "and end on a participant: differences smaller than this may be the "
                    "machine, not the layers"}
    return out


def write_metrics(run_dir: Path, log: MetricsLog) -> Path | None:
    """``metrics.csv`` of every sample (atomically); None without samples."""
    rows = log.rows()
    if not rows:
        return None
    import csv
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=log.columns(), extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    path = Path(run_dir) / METRICS_FILE
    atomic_write(path, buf.getvalue())
    return path


def _kb(v: Any) -> str:
    return "-" if v is None else f"{v / 1024:.0f} MiB"


def metrics_lines(summary: dict) -> list[str]:
    """What ``tracr results show`` prints of the metrics: per participant its peak RSS, CPU,
    throttling and energy (each figure with its method and label, or why there is none),
    and a flag where the machine's drift could explain the ranking of the splits."""
    lines = []
    for inst, m in (summary.get("metrics") or {}).items():
        mem, cpu, thr = m.get("memory") or {}, m.get("cpu") or {}, m.get("throttling") or {}
        parts = [f"peak RSS {_kb(mem.get('peak_rss_kb'))}"]
        if mem.get("cuda_peak_allocated_bytes") is not None:
            parts.append(f"CUDA peak {mem['cuda_peak_allocated_bytes'] / 2**20:.0f} MiB")
        if cpu.get("utilization_cores") is not None:
            parts.append(f"CPU {cpu['utilization_cores']:.2f} cores")
        if thr.get("throttled_ms") is not None:
            parts.append(f"throttled {thr['throttled_ms']:.1f} ms ({thr['nr_throttled']} "
                         "periods)")
        for name, e in (m.get("energy") or {}).items():
            if e.get("status") == "ok" and e.get("interval"):
                lo, hi = e["interval"]
                parts.append(f"{name} {e['j_per_inference']:.3g} J/inference [{lo:.3g}, "
                             f"{hi:.3g}] ({e['label']})")
            elif e.get("status") == "ok":  # a run without inference rows (a token pipeline)
                parts.append(f"{name} {e.get('joules', 0):.3g} J over {e.get('window_s', 0):.1f}"
                             f" s ({e['label']})")
            else:
                parts.append(f"{name} {e.get('status')}: {e.get('reason', '')}")
        lines.append(f"{inst}: " + "; ".join(parts))
    flag = drift_flag(summary)
    if flag:
        lines.append(flag)
    return lines

