"""A lab host's CPU throttling, read by the observer.

A participant reads its cgroup's ``cpu.stat`` itself (``runtime/sampler.py``), but inside
a lab host ``ip netns exec`` mounts a fresh /sys without the cgroup tree, so there it
reads nothing. The lab's hosts run on the observer's machine, and the lab's state names
each host's cgroup: the observer reads that ``cpu.stat`` at every poll instead
(:class:`app_api.results.metrics.MetricsLog`), so a quota'd or paced host's throttled
periods and time reach the run all the same.
"""

from __future__ import annotations

from pathlib import Path

from app_api.lab.state import load_state
from experiment_design.errors import TracrError


def lab_cpu_stat(device: str) -> Path | None:
    """The ``cpu.stat`` of lab host ``device``'s cgroup, or None (not a lab host, no lab,
    a host without a CPU limit)."""
    try:
        state = load_state()
    except TracrError:
        return None
    for h in (state or {}).get("hosts") or []:
        if h.get("name") == device and h.get("cgroup"):
            path = Path(h["cgroup"]) / "cpu.stat"
            return path if path.exists() else None
    return None
