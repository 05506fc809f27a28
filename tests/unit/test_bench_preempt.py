"""`tracr bench preempt`: a pinned worker alone, beside a real-time intruder on its CPU,
and paced by the lab's real pacer in a cgroup the benchmark creates and removes."""

from __future__ import annotations

import argparse
import os

import pytest

from app_api.bench import preempt
from app_api.lab import cgroup


def _args(**kw) -> argparse.Namespace:
    base = {"every_us": [1000], "fraction": 0.25, "tick_ms": None, "layers": 2, "repeats": 6,
            "cpu": None}
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or cgroup.cgroup_version() is None,
                    reason="pacing needs root and the cgroup cpu controller")
def test_every_case_runs_and_the_paced_one_leaves_nothing_behind():
    root = cgroup.cgroup_path("x").parent
    result = preempt.run(_args())
    assert result["alone"]["realtime"] is True and result["alone"]["cpu_ms"] > 0
    woken = result["woken every 1000 us"]
    # an intruder at a higher real-time priority only adds to the worker's time
    assert woken["wall_ms"] >= woken["cpu_ms"] * 0.9
    assert "cost_per_wakeup_us" in woken and woken["cpu_inflation"] > 0
    paced = result["paced 0.25"]
    # the pacer held the worker to about a quarter of a core
    assert 0.6 < paced["wall_x_fraction_over_cpu"] < 1.6
    assert not list(root.glob(f"tracr-bench-preempt-{os.getpid()}"))


@pytest.mark.slow
def test_without_root_the_paced_case_says_why(monkeypatch):
    monkeypatch.setattr(preempt.os, "geteuid", lambda: 1000)
    result = preempt.run(_args(every_us=[100_000], repeats=3))
    assert result["paced"].startswith("skipped: pacing needs root")
