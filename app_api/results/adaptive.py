"""An adaptive run's record: ``adaptive.csv`` (its decisions over time) and the
``adaptive`` block of ``summary.json`` (its hindsight scores, :mod:`.hindsight`).

The head's ``adaptive`` partitioner returns its log inside its final decision; the
observer moves the log out of ``summary.json`` into ``adaptive.csv`` (one row per
adaptive inference, probe, switch and phase change) and scores the run.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from app_api.fsutil import atomic_csv
from app_api.results.hindsight import TraceClock, score

log = logging.getLogger(__name__)

ADAPTIVE_FILE = "adaptive.csv"
LOG_COLUMNS = ["t_unix", "inference", "event", "split", "estimate_Bps", "predicted_ms",
               "e2e_ms", "reason"]
#: the interval of the trace scored at once, without evaluate.hindsight in the manifest
DEFAULT_INTERVAL_S = 10.0


def adaptive_decision(summary: Mapping) -> tuple[str, dict] | None:
    """(instance, decision) of the run's adaptive partitioner, or None when it has none."""
    for inst, plan in (summary.get("partitioner") or {}).items():
        dec = (plan or {}).get("decision") or {}
        if dec.get("name") == "adaptive" and dec.get("phases") is not None:
            return inst, dec
    return None


def write_log(run_dir: Path, rows: Sequence[Mapping]) -> Path:
    """Write ``adaptive.csv`` (atomically) from the decision's log rows."""
    return atomic_csv(Path(run_dir) / ADAPTIVE_FILE, LOG_COLUMNS, rows)


def write_link_csv(run_dir: Path, entries: Sequence[Mapping]) -> Path:
    """Write ``link.csv`` (atomically): the lab links' timeline over the run, one column per
    key the entries have (``t``, ``link``, ``dir``, ``rate_Bps``, ... ``trace_t0``)."""
    cols = list(dict.fromkeys(k for e in entries for k in e))
    return atomic_csv(Path(run_dir) / "link.csv", cols, entries)


class LinkTimeline:
    """The link's configured rate against wall time, from timeline entries (``t`` in Unix
    seconds and ``rate_Bps``, in time order; the rate holds until the next entry), and the
    trace's clock when the entries say where the trace started (``trace_t0``) and its
    period (``period_s``)."""

    def __init__(self, entries: Sequence[Mapping]) -> None:
        rows = sorted((float(e["t"]), e) for e in entries if e.get("t") is not None)
        self.times = [t for t, _ in rows]
        self.entries = [e for _, e in rows]

    def rate_at(self, t: float) -> float | None:
        """The configured rate (bytes/s) at wall time ``t``; None before the first entry."""
        i = bisect.bisect_right(self.times, t) - 1
        if i < 0:
            return None
        v = self.entries[i].get("rate_Bps")
        return None if v is None else float(v)

    def clock(self) -> TraceClock | None:
        """The trace's clock, when the entries carry its start and period."""
        for e in self.entries:
            if e.get("trace_t0") is not None and e.get("period_s"):
                return TraceClock(float(e["trace_t0"]), float(e["period_s"]))
        return None


def clock_for(phases: Mapping, timeline: LinkTimeline | None) -> tuple[TraceClock, str]:
    """The trace clock the phases are aligned by, and how it was found: the timeline's
    (the trace's own start and period), else, on a link with no trace, each phase's start
    (the sweep's length as the period: the link is the same throughout)."""
    clock = timeline.clock() if timeline is not None else None
    if clock is not None:
        return clock, "the link trace's own clock (timeline)"
    sweep = phases.get("sweep") or [None, None]
    period = (sweep[1] - sweep[0]) if sweep[0] is not None and sweep[1] is not None else None
    if period and phases.get("adaptive") == sweep:  # interleaved: one stretch of time
        period = None
    t0 = sweep[0] if sweep[0] is not None else (phases.get("adaptive") or [0.0])[0]
    return TraceClock(float(t0), period or None), "each phase from its start (no trace)"


def adaptive_summary(summary: dict, rows: Sequence[Mapping], run_dir: Path | None,
                     hindsight: Mapping | None = None,
                     timeline: Sequence[Mapping] | None = None) -> dict | None:
    """The ``adaptive`` block of ``summary.json``: the switches, the probes, and the
    hindsight scores (when the partitioner ran a sweep phase); writes ``adaptive.csv``
    and takes the log out of the summary's decision. None without an adaptive partitioner.

    ``hindsight``: the manifest's ``evaluate.hindsight`` (``interval_s``, ``min_samples``);
    ``timeline``: the link's timeline entries over the run (the lab's), or None.
    """
    found = adaptive_decision(summary)
    if found is None:
        return None
    inst, dec = found
    log_rows = dec.pop("log", None) or []
    if run_dir is not None:
        write_log(run_dir, log_rows)
    line = LinkTimeline(timeline) if timeline else None
    out: dict = {"instance": inst, "candidates": dec.get("candidates"),
                 "phases": dec.get("phases"), "switches": len(dec.get("switches") or []),
                 "probes": dec.get("probes"), "initial": dec.get("initial"),
                 "log_rows": len(log_rows), "timeline": bool(line),
                 "link": (timeline[0].get("link"), timeline[0].get("dir")) if timeline else None,
                 "sweep_ids": dec.get("sweep_ids")}
    phases = dec.get("phases") or {}
    if not phases.get("sweep"):
        out["hindsight"] = {"error": "no sweep phase (partitioner.params.sweep_s is 0)"}
        return out
    cfg = dict(hindsight or {})
    clock, how = clock_for(phases, line)
    scored = score(rows, phases, clock, float(cfg.get("interval_s") or DEFAULT_INTERVAL_S),
                   int(cfg.get("min_samples") or 2),
                   rate_of=line.rate_at if line is not None else None,
                   sweep_ids=dec.get("sweep_ids"))
    scored["aligned_by"] = how
    scored["clock"] = {"t0": clock.t0, "period_s": clock.period_s}
    out["hindsight"] = scored
    for key in ("adaptive_over_hindsight", "adaptive_over_best_fixed",
                "adaptive_over_hindsight_mean", "adaptive_over_hindsight_cv",
                "hindsight_over_best_fixed", "adaptive_ms",
                "hindsight_ms", "best_fixed", "best_fixed_ms", "adaptive_mean_ms"):
        out[key] = scored.get(key)
    return out
