"""`tracr bench drift`: the same work timed once a round on every CPU, window by window."""

from __future__ import annotations

import argparse
import os

import psutil
import pytest

from app_api.bench import drift


def _args(**kw) -> argparse.Namespace:
    base = {"seconds": 4.0, "window_s": 1.0, "interval_s": 0.2, "cpu": None, "layers": 2}
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.slow
def test_every_cpu_gets_a_pinned_worker_and_window_medians_of_each_kind():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result = drift.run(_args())
    cpus = sorted(os.sched_getaffinity(0))
    assert result["cpus"] == cpus
    for cpu in cpus:
        case = result[f"cpu {cpu}"]
        assert case["rounds"] >= 4
        for kind in drift.KINDS:
            assert case[kind]["median_ms"] > 0
            assert len(case[kind]["window_medians_ms"]) >= 3
            assert case[kind]["drift_pct"] >= 0
    if len(cpus) >= 2:
        assert set(result["correlation"]) == {*drift.KINDS, "cpus"}
    # the workers are gone
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_windows_drift_and_correlation_from_known_rows():
    rows = [[0.1, 1.0, 10.0, 5.0], [0.6, 1.0, 12.0, 5.0],
            [1.1, 1.0, 11.0, 6.0], [1.7, 1.0, 11.0, 6.0], [2.2, 1.0, 9.0, 5.5]]
    w = drift.windows(rows, 1.0)
    assert w == {"gemm": [1.0, 1.0, 1.0], "copy": [11.0, 11.0, 9.0], "model": [5.0, 6.0, 5.5]}
    assert drift.drift_pct(w["gemm"]) == 0.0
    assert abs(drift.drift_pct(w["model"]) - 20.0) < 1e-9
    assert drift.drift_pct([3.0]) is None
    assert abs(drift.correlation([1, 2, 3], [2, 4, 6]) - 1.0) < 1e-9
    assert drift.correlation([1, 1, 1], [1, 2, 3]) is None  # constant: no r
    assert drift.correlation([1, 2], [1, 2]) is None  # too short


@pytest.mark.slow
def test_one_cpu_named_gets_no_correlation():
    cpu = max(os.sched_getaffinity(0))
    result = drift.run(_args(seconds=1.5, cpu=[cpu]))
    assert result["cpus"] == [cpu] and "correlation" not in result
