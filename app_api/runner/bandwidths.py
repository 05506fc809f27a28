"""A bandwidth loop: one run per rate in ``network.bandwidths``, grouped in one directory.

::

    $TRACR_RESULTS_DIR/<experiment>/<group-id>/
        group.json             the group summary (one row per bandwidth, see below)
        bw-1MBps/              an ordinary run directory (summary.json, csv, plots)
        bw-4MBps/ ...

Each row of ``group.json``'s ``rows`` says, for one rate: the link as measured
by the lab, the measured best split and its median latency, and each scored
partitioner's choice and regret, so the table shows how the best split moves
with bandwidth. The lab's shaping from before the loop is restored at the end.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from app_api.results import new_run_id, results_root
from app_api.results.store import write_group
from app_api.runner import shaping
from app_api.runner.labfacts import lab_facts
from app_api.runner.observer import RunResult, run_experiment
from app_api.runner.plan import SWEEP, RunPlan
from app_api.units import parse_rate
from experiment_design.errors import TracrError

log = logging.getLogger(__name__)


# A bandwidth loop reports like one run: its directory (the group), summary, ok, errors.
GroupResult = RunResult


def group_row(bandwidth: str, summary: dict | None, run_dir: Path, group_dir: Path) -> dict:
    """One table row of a group from one run's summary."""
    s = summary or {}
    lab = ((s.get("network") or {}).get("lab")) or {}
    parts = {}
    for label, p in (s.get("partitioners") or {}).items():
        parts[label] = {k: p.get(k) for k in ("chosen", "chosen_ms", "regret", "spearman", "error")
                        if k in p}
    best = next((r for r in s.get("splits") or [] if r.get("split") == s.get("best_split")), None)
    try:
        rel = str(run_dir.relative_to(group_dir))
    except ValueError:
        rel = str(run_dir)
    return {
        "bandwidth": bandwidth,
        "bandwidth_Bps": parse_rate(bandwidth),
        "measured_Bps": lab.get("bandwidth_Bps"),
        "rtt_ms": lab.get("rtt_ms"),
        "run": rel,
        "run_id": s.get("run_id"),
        "status": s.get("status", "incomplete"),
        "best": s.get("best_split"),
        "best_layer": best.get("layer") if best else None,
        "best_ms": best.get("e2e_ms_median") if best else None,
        "noise_regret": (s.get("measurement_noise") or {}).get("regret"),
        "noise_contenders": ((s.get("measurement_noise") or {}).get("contenders") or {}).get(
            "regret"),
        "partitioners": parts,
    }


def run_bandwidths(plan: RunPlan, out_dir: str | os.PathLike | None = None,
                   progress: bool = True,
                   say: Callable[[str], None] = lambda m: None) -> GroupResult:
    """Run a sweep plan's runs, each over the reshaped lab link; write the group summary."""
    if plan.kind != SWEEP:
        raise ValueError(f"run_bandwidths() runs a sweep plan, not a {plan.kind} one")
    manifest = plan.manifest
    shaping.check_lab_participants(manifest)
    group_id = new_run_id()
    group_dir = Path(out_dir) if out_dir else results_root() / manifest.name / group_id
    group_dir.mkdir(parents=True, exist_ok=True)
    doc: dict = {
        "kind": "bandwidth-group",
        "experiment": manifest.name,
        "group_id": group_id,
        "model": (manifest.model or {}).get("name"),
        "bandwidths": plan.bandwidths,
        "overrides": manifest.overrides,
        "status": "running",
        "rows": [],
        "errors": [],
    }
    write_group(group_dir, doc)
    errors: list[str] = []
    t0 = time.perf_counter()
    status = "failed"
    try:
        with shaping.keep_shaping(say=say) as before:
            doc["lab_shaping_before"] = before
            for run in plan.runs:
                bw = run.bandwidth
                run_dir = group_dir / run.subdir
                say(f"bandwidth {bw}: shaping the lab link and running {manifest.name}")
                report = shaping.apply(bw, run.delay_ms, run.link, say=say)
                res = run_experiment(run.manifest, out_dir=run_dir, progress=progress,
                                     facts=lab_facts(run.manifest, link=report))
                doc["rows"].append(group_row(bw, res.summary, run_dir, group_dir))
                errors += [f"{bw}: {e}" for e in res.errors]
                write_group(group_dir, doc)
        status = "ok" if not errors else "failed"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    except TracrError as exc:
        errors.append(str(exc))
        raise
    finally:
        doc.update(status=status, errors=errors, wall_s=time.perf_counter() - t0)
        doc["lab_shaping_after"] = _safe_shaping()
        write_group(group_dir, doc)
    return GroupResult(run_dir=group_dir, summary=doc, ok=status == "ok", errors=errors)


def _safe_shaping() -> dict | None:
    try:
        return shaping.current_shaping()
    except Exception:  # the lab may be gone; the group summary must still be written
        return None
