"""What one configuration of a chain measured: throughput, latency, and each stage's load.

Computed by the head from the records every stage returned with each reply, so every
figure comes from the same run. Definitions (they are what ``summary.json`` and
``configs.csv`` report):

- **throughput** (inferences/s): in throughput mode, completions after the pipeline
  filled (the first ``in_flight`` are left out) over the time between them; in latency
  mode, inferences over the time from the first start to the last reply.
- **stage time**: a stage's median compute plus its outgoing transfer, the transfer
  being its median encoded bytes over the link's probed bandwidth plus half the
  link's round trip (when the link was not probed: the median time its sends took).
- **bound** (inferences/s): ``1000 / max stage time (ms)``; a pipeline cannot beat its
  slowest stage.
- **utilization**: a stage's summed compute over its span (first compute start to last
  compute end, on its own clock); the rest of the span is its **bubble** (idle) time.
- **cpu_ms**: the median CPU time of a stage's layers (its compute thread's clock).
- **predicted_*** (a configuration a partitioner planned): the plan's figures for each
  stage: ``predicted_compute_ms`` (its layers, the wall time beside ``compute_ms``),
  ``predicted_overhead_ms`` (its CPU beside its layers and the bytes it moves, as wall
  time) and ``predicted_stage_ms`` (its period; the slowest is the predicted bound).
"""

from __future__ import annotations

import statistics
from typing import Any


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    i = min(len(s) - 1, max(0, round(q * (len(s) - 1))))
    return s[i]


def throughput_per_s(done: list[Any], mode: str, in_flight: int) -> float | None:
    """Inferences per second of the completed inferences ``done`` (see module docstring)."""
    ok = sorted((c for c in done if not c.error), key=lambda c: c.t_done)
    if not ok:
        return None
    if mode == "throughput" and len(ok) > in_flight >= 1:
        span = ok[-1].t_done - ok[in_flight - 1].t_done
        n = len(ok) - in_flight
    else:
        span = ok[-1].t_done - min(c.record["t_start"] for c in ok)
        n = len(ok)
    return n / (span / 1e9) if span > 0 else None


def stage_summaries(done: list[Any], links: dict[str, dict] | None = None) -> list[dict]:
    """Per stage of the route: load, queue, bytes and the time the bound is made of."""
    ok = [c for c in done if not c.error]
    if not ok:
        return []
    route = ok[0].route
    out = []
    for hop in range(route.k):
        recs = [c.stages()[hop] for c in ok if len(c.stages()) > hop]
        if not recs:
            continue
        name = recs[0].get("instance", route.route[hop])
        nxt = route.route[hop + 1] if hop + 1 < route.k else route.route[0]
        compute = [float(r.get("compute_ms") or 0.0) for r in recs]
        cpu = [float(r["cpu_ms"]) for r in recs if r.get("cpu_ms") is not None]
        sent = [int(r.get("bytes_encoded") or 0) for r in recs]
        sends = [float(r.get("send_ms") or 0.0) for r in recs]
        span_ns = max(r["t_end"] for r in recs) - min(r["t_start"] for r in recs)
        busy = sum(compute)
        link = (links or {}).get(f"{name}>{nxt}")
        bytes_out = statistics.median(sent) if sent else 0
        if route.k == 1:
            transfer = 0.0
        elif link and link.get("bandwidth_Bps"):
            transfer = bytes_out / float(link["bandwidth_Bps"]) * 1e3 + \
                float(link.get("rtt_ms") or 0.0) / 2
        else:
            transfer = statistics.median(sends) if sends else 0.0
        span_ms = span_ns / 1e6
        queues = [int(r.get("queue") or 0) for r in recs]
        out.append({
            "hop": hop, "instance": name, "first": int(recs[0].get("a", 0)) + 1,
            "last": int(recs[0].get("b", 0)), "to": nxt if route.k > 1 else None,
            "compute_ms": statistics.median(compute), "compute_ms_mean": statistics.fmean(compute),
            "cpu_ms": statistics.median(cpu) if cpu else None,
            "transfer_ms": transfer, "stage_ms": statistics.median(compute) + transfer,
            "send_ms": statistics.median(sends) if sends else 0.0,
            "bytes_out": bytes_out,
            "forwarded_bytes": statistics.median(int(r.get("forwarded_bytes") or 0)
                                                 for r in recs),
            "busy_ms": busy, "span_ms": span_ms,
            "utilization": busy / span_ms if span_ms > 0 else None,
            "bubble_ms": max(0.0, span_ms - busy),
            "queue_mean": statistics.fmean(queues), "queue_max": max(queues),
            "inferences": len(recs),
        })
    return out


def summarize(done: list[Any], *, mode: str, in_flight: int, batch: int,
              links: dict[str, dict] | None = None, bandwidth: str = "",
              predicted: dict | None = None) -> dict[str, Any]:
    """One configuration: its ``configs.csv`` row plus ``stages`` (see module docstring)."""
    route = done[0].route if done else None
    ok = [c for c in done if not c.error]
    lat = [c.e2e_ms for c in ok]
    thr = throughput_per_s(done, mode, in_flight)
    stages = stage_summaries(done, links)
    planned = (predicted or {}).get("stages") or []
    if len(planned) == len(stages):
        for stage, plan in zip(stages, planned, strict=True):
            stage["predicted_compute_ms"] = plan.get("compute_ms")
            stage["predicted_overhead_ms"] = plan.get("overhead_ms")
            stage["predicted_stage_ms"] = plan.get("stage_ms")
    worst = max((s["stage_ms"] for s in stages), default=0.0)
    per_link = [s["bytes_out"] for s in stages] if route is not None and route.k > 1 else []
    row: dict[str, Any] = {
        "cuts": list(route.cuts) if route else [], "chain": list(route.route) if route else [],
        "mode": mode, "bandwidth": bandwidth, "batch": batch,
        "in_flight": in_flight if mode == "throughput" else 1,
        "inferences": len(done), "items": len(ok) * batch, "errors": len(done) - len(ok),
        "throughput_per_s": thr, "items_per_s": thr * batch if thr is not None else None,
        "latency_ms_p50": _pct(lat, 0.5), "latency_ms_p95": _pct(lat, 0.95),
        "latency_ms_mean": statistics.fmean(lat) if lat else None,
        "bound_per_s": 1e3 / worst if worst > 0 else None,
        "bytes_per_inference": sum(per_link) if per_link else 0,
        "predicted_throughput_per_s": (predicted or {}).get("throughput_per_s"),
        "predicted_latency_ms": (predicted or {}).get("latency_ms"),
    }
    return {"row": row, "stages": stages}


def stage_rows(c: Any, config: str, mode: str) -> list[dict[str, Any]]:
    """The ``stages.csv`` rows of one inference: one per stage, times in ms on each
    stage's own clock (``perf_counter``; one clock for every host of the lab)."""
    rows = []
    for r in c.stages():
        rows.append({
            "inference": c.iid, "config": config, "mode": mode, "hop": int(r.get("hop", 0)),
            "instance": r.get("instance", ""), "first": int(r.get("a", 0)) + 1,
            "last": int(r.get("b", 0)), "queue": r.get("queue", 0),
            "decode_ms": r.get("decode_ms"), "compute_ms": r.get("compute_ms"),
            "cpu_ms": r.get("cpu_ms"), "encode_ms": r.get("encode_ms"),
            "send_ms": r.get("send_ms"), "bytes_out": r.get("bytes_encoded"),
            "forwarded_bytes": r.get("forwarded_bytes", 0),
            "t_arrive_ms": _ms(r.get("t_arrive")), "t_start_ms": _ms(r.get("t_start")),
            "t_end_ms": _ms(r.get("t_end")), "t_sent_ms": _ms(r.get("t_sent")),
            "cpu_wait_ms": r.get("cpu_wait_ms"),
            "handoff_cpu_ms": r.get("handoff_cpu_ms"),
            "handoff_others_cpu_ms": r.get("handoff_others_cpu_ms"), "error": c.error or "",
        })
    return rows


def _ms(ns: Any) -> float | None:
    return None if ns is None else ns / 1e6
