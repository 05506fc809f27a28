"""The machine's own drift during a run, and what it could explain.

Each participant times the same reference workload at set-up and after each task
(``experiment_design.runtime.sampler``); ``summary.json`` ``machine_drift`` holds the
largest move of any participant. A ranking of splits closer than that, or a difference
between runs within it, may be the machine, not the layers.
"""

from __future__ import annotations

from pathlib import Path


def drift_flag(summary: dict) -> str | None:
    """A warning where the machine's own drift during the run (the reference workload,
    ``machine_drift``) is at least the gap between the best split's median and the next
    one's: the ranking may be the machine's, not the layers'."""
    drift = (summary.get("machine_drift") or {}).get("max_pct")
    meds = sorted(s["e2e_ms_median"] for s in summary.get("splits") or []
                  if s.get("e2e_ms_median"))
    if drift is None or len(meds) < 2:
        return None
    gap = (meds[1] / meds[0] - 1) * 100
    if drift < gap:
        return None
    who = max((summary["machine_drift"].get("by_instance") or {}).items(),
              key=lambda kv: kv[1], default=("?", drift))[0]
    return (f"machine drift: the reference workload moved {drift:.1f}% on {who} during the "
            f"run, more than the {gap:.1f}% between the best split and the next: the ranking "
            "could be the machine's")


def drift_of_runs(run_dirs: list[str]) -> list[float | None]:
    """Each run's ``machine_drift.max_pct`` (None where it was not measured)."""
    import json

    out: list[float | None] = []
    for d in run_dirs:
        try:
            s = json.loads((Path(d) / "summary.json").read_text())
        except (OSError, ValueError):
            s = {}
        out.append((s.get("machine_drift") or {}).get("max_pct"))
    return out

