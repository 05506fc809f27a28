"""`tracr bench quota`: a fixed piece of model work, unlimited and under a CPU quota, in a
real cgroup that the benchmark creates and removes again."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from app_api.bench import quota
from app_api.lab import cgroup


def _args(**kw) -> argparse.Namespace:
    base = {"fraction": None, "period_ms": None, "layers": 2, "repeats": 8, "cpu": None,
            "gap_ms": None}
    base.update(kw)
    return argparse.Namespace(**base)


def _ours() -> list[Path]:
    root = cgroup.cgroup_path("x").parent
    return sorted(root.glob(f"tracr-bench-{os.getpid()}"))


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or cgroup.cgroup_version() is None,
                    reason="a CPU quota needs root and the cgroup cpu controller")
def test_the_quota_case_runs_in_a_cgroup_of_its_own_and_removes_it():
    # eleven blocks are 8.5-14 ms of CPU. A quarter core gets 2.5 ms per 10 ms, and the
    # kernel notices the spent quota only at its next tick (4 ms at HZ=250), so a pass runs
    # at most 6.5 ms before it waits: every pass waits at least once. (Four blocks, ~5 ms,
    # sometimes fit in 2.5 ms + a tick's overrun and did not wait at all.)
    result = quota.run(_args(fraction=[0.25], period_ms=10, layers=11))
    unlimited, held = result["unlimited"], result["quota 0.25"]
    assert result["gap_ms"] == 20.0 and unlimited["idle_inflation"] > 0
    for case in (result["back to back"], unlimited, held):
        for kind in ("wall", "cpu"):
            assert case[kind]["median_ms"] > 0 and case[kind]["iqr_pct"] >= 0
            assert case[kind]["split_half_pct"] >= 0
    # a pass that outlasts its quota waits for the next period: wall above CPU time
    assert held["wall_over_cpu"] > 1.25 > unlimited["wall_over_cpu"] * 1.1
    assert held["cpu_inflation"] > 0
    assert result["period_ms"] == 10.0
    assert _ours() == []


def test_a_quota_too_small_for_its_period_is_refused_before_anything_runs():
    from experiment_design.errors import TracrError

    with pytest.raises(TracrError, match="below the kernel"):
        cgroup.quota_us(0.05, 10_000)
