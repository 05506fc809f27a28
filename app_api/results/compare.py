"""Runs of one experiment side by side: did the best split move, and did the machine?

Two runs of the same manifest on the same lab should find the same best split at the
same median. When the best median moves between runs, it matters whether that split
alone moved or everything did: a machine that is a few percent slower for an hour (a
virtual machine's neighbours, its host's clock) moves every split's median by about
the same factor. For each bandwidth the comparison gives

- each run's best split, its median and its best set (the splits it cannot separate
  from the best, ``summary.json``'s ``best_set``);
- ``best_moved``: the largest best median over the smallest, minus 1;
- ``shift``: per run, the median over every split measured in all the runs of (this
  run's median / the first run's median), the common factor by which the whole run
  moved (1.0 for the first run);
- ``best_moved_beyond_shift``: ``best_moved`` after dividing each run's best median by
  its shift, what the best split moved that the other splits did not;
- ``reference_moved``: how far each device's start-up reference moved, the whole model
  run once on that device before the sweep (``full_ms`` of its profile in
  ``partitioners.json``), a measure of the device's speed taken outside the sweep;
- ``machine_drift_pct``: per run, how far its participants' reference workload moved
  between the run's start and end (summary.json ``machine_drift``), and
  ``drift_could_explain``: whether ``best_moved`` is within the largest of them;
- ``parts``: the first run's best split in every run: its median end-to-end, edge,
  transfer and cloud time and each device's CPU time (ms) per run, so a move can be put
  on the device or the link that made it, and on a device's speed (CPU time) or its
  share of a CPU (wall time for the same CPU time).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app_api.results.drift import drift_of_runs
from app_api.results.store import load_group, load_summary
from experiment_design.errors import TracrError

SINGLE = "-"  # the label of a run that is not part of a bandwidth group
ROLES = ("edge", "cloud")
PARTS = ("e2e", "edge", "edge_cpu", "transfer", "cloud", "cloud_cpu")


@dataclass
class Point:
    """One run at one bandwidth: what the comparison needs from its files."""

    label: str
    run_dir: Path
    model: str
    best: int
    best_ms: float | None
    best_set: list[int]
    medians: dict[int, float]
    reference_ms: dict[str, float] = field(default_factory=dict)
    parts: dict[int, dict[str, float | None]] = field(default_factory=dict)


def _point(run_dir: Path, label: str) -> Point | None:
    summary = load_summary(run_dir)
    if summary is None or summary.get("best_split") is None:
        return None
    rows = [s for s in summary.get("splits", []) if s.get("e2e_ms_median") is not None]
    medians = {int(s["split"]): float(s["e2e_ms_median"]) for s in rows}
    parts = {int(s["split"]): {part: s.get(f"{part}_ms_median") for part in PARTS}
             for s in rows}
    best = int(summary["best_split"])
    tie = summary.get("best_set") or {}
    refs: dict[str, float] = {}
    try:
        inputs = json.loads((run_dir / "partitioners.json").read_text()).get("inputs", {})
    except (OSError, ValueError):
        inputs = {}
    for role in ROLES:
        full = (inputs.get(f"{role}_profile") or {}).get("full_ms")
        if isinstance(full, (int, float)):
            refs[role] = float(full)
    return Point(label=label, run_dir=run_dir, model=str(summary.get("model", "")),
                 best=best, best_ms=medians.get(best), best_set=[int(s) for s in
                                                                 tie.get("splits", [best])],
                 medians=medians, reference_ms=refs, parts=parts)


def load_points(run_dir: str | Path) -> dict[str, Point]:
    """A run's points by bandwidth label: one per run of a bandwidth group, or one
    (label ``-``) for a single run. Runs without a summary are left out."""
    run_dir = Path(run_dir)
    group = load_group(run_dir)
    points: dict[str, Point] = {}
    if group is not None:
        for row in group.get("rows", []):
            p = _point(run_dir / row["run"], str(row["bandwidth"]))
            if p is not None:
                points[p.label] = p
        return points
    p = _point(run_dir, SINGLE)
    if p is not None:
        points[SINGLE] = p
    return points


def _moved(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0]
    return max(vals) / min(vals) - 1.0 if len(vals) >= 2 else None


def shifts(points: Sequence[Point]) -> list[float | None]:
    """Per point, the median over the splits measured in every point of its median over
    the first point's: how far the whole run moved (None without a common split)."""
    common = set(points[0].medians)
    for p in points[1:]:
        common &= set(p.medians)
    if not common:
        return [None for _ in points]
    return [statistics.median(p.medians[s] / points[0].medians[s] for s in sorted(common))
            for p in points]


def compare_points(points: Sequence[Point]) -> dict:
    """The comparison of one bandwidth's points (one per run, in the runs' order)."""
    shift = shifts(points)
    bests = [p.best_ms for p in points]
    beyond = ([b / s for b, s in zip(bests, shift, strict=True)]
              if None not in shift and None not in bests else [])
    ties = all(p.best in q.best_set for p in points for q in points)
    ref = points[0].best
    parts = {part: [p.parts.get(ref, {}).get(part) for p in points] for part in PARTS}
    return {
        "bandwidth": points[0].label,
        "runs": [{"run": str(p.run_dir), "best": p.best, "best_ms": p.best_ms,
                  "best_set": p.best_set, "reference_ms": p.reference_ms} for p in points],
        "same_best": len({p.best for p in points}) == 1,
        "bests_tie": ties,
        "best_moved": _moved(bests),
        "shift": shift,
        "best_moved_beyond_shift": _moved(beyond),
        "common_splits": len(set.intersection(*(set(p.medians) for p in points))),
        "reference_moved": {role: _moved([p.reference_ms.get(role) for p in points])
                            for role in ROLES},
        "parts": {"split": ref, **parts},
        **_drift([str(p.run_dir) for p in points], _moved(bests)),
    }


def _drift(run_dirs: list[str], moved: float | None) -> dict:
    drifts = drift_of_runs(run_dirs)
    known = [d for d in drifts if d is not None]
    could = (moved * 100 <= max(known)) if known and moved is not None else None
    return {"machine_drift_pct": drifts, "drift_could_explain": could}


def compare_runs(run_dirs: Sequence[str | Path]) -> dict:
    """Compare runs of one experiment, bandwidth by bandwidth (the bandwidths every run
    has, in the first run's order). A TracrError for fewer than two runs, a run without
    a best split, runs of different models or runs without a bandwidth in common."""
    if len(run_dirs) < 2:
        raise TracrError("compare needs two runs or more")
    loaded = []
    for d in run_dirs:
        pts = load_points(d)
        if not pts:
            raise TracrError(f"{d} has no finished run with a best split to compare",
                             hint="see `tracr results ls`")
        loaded.append(pts)
    models = {p.model for pts in loaded for p in pts.values()}
    if len(models) > 1:
        raise TracrError(f"the runs are of different models ({', '.join(sorted(models))})")
    labels = [lab for lab in loaded[0] if all(lab in pts for pts in loaded[1:])]
    if not labels:
        raise TracrError("the runs have no bandwidth in common",
                         hint="compare runs of the same manifest")
    rows = [compare_points([pts[lab] for pts in loaded]) for lab in labels]
    return {"model": models.pop(), "runs": [str(d) for d in run_dirs], "rows": rows,
            "left_out": sorted({lab for pts in loaded for lab in pts} - set(labels))}
