"""Hindsight scoring of an adaptive run from synthetic records, adaptive.csv and its plot."""

from __future__ import annotations

import csv
import json
import statistics

import pytest

from app_api.results.adaptive import ADAPTIVE_FILE, adaptive_summary
from app_api.results.adaptive_plot import draw_adaptive
from app_api.results.hindsight import TraceClock, score
from experiment_design.protocol import INFER_COLUMNS

# A trace of period 20 s: fast for 10 s, slow for 10 s. Split 0 takes 20 ms on the fast
# link and 70 ms on the slow one; split 2 takes 40 ms on either.
T0, PERIOD = 1000.0, 20.0


def fast(t: float) -> bool:
    return (t - T0) % PERIOD < 10.0


def e2e(split: int, t: float) -> float:
    return (20.0 if fast(t) else 70.0) if split == 0 else 40.0


def rows_between(start: float, end: float, choose) -> list[dict]:
    """Back-to-back inferences from ``start`` to ``end``, at the split ``choose(i, t)``."""
    out, t, i = [], start, 0
    while t < end:
        k = choose(i, t)
        ms = e2e(k, t)
        out.append({"inference": i, "t_unix": t, "split": k, "e2e_ms": ms})
        t += ms / 1e3
        i += 1
    return out


def test_perfect_adaptive_matches_hindsight_and_beats_the_best_fixed_split():
    sweep = rows_between(T0, T0 + 40.0, lambda i, t: (0, 2)[i % 2])
    # the adaptive phase starts half a period out of step with the sweep: the trace's
    # clock, not the phase's start, must line them up
    start = T0 + 50.0
    adapt = rows_between(start, start + 20.0, lambda i, t: 0 if fast(t) else 2)
    out = score(sweep + adapt, {"sweep": [T0, T0 + 40.0], "adaptive": [start, start + 20.0]},
                TraceClock(T0, PERIOD), interval_s=10.0)
    assert out["intervals_scored"] == 2
    assert [r["best_split"] for r in out["intervals"]] == [0, 2]
    assert out["hindsight_ms"] == pytest.approx(30.0)
    assert out["best_fixed"] == 2 and out["best_fixed_ms"] == pytest.approx(40.0)
    assert out["adaptive_over_hindsight"] == pytest.approx(1.0, abs=0.01)
    assert out["adaptive_over_best_fixed"] == pytest.approx(0.75, abs=0.01)
    assert out["hindsight_over_best_fixed"] == pytest.approx(0.75)
    assert out["adaptive_over_hindsight_mean"] == pytest.approx(1.0, abs=0.01)
    # the plain mean over inferences counts the fast interval's many inferences more
    assert out["adaptive_mean_ms"] < out["adaptive_ms"]


def test_misaligned_clock_and_a_stuck_policy_score_worse():
    sweep = rows_between(T0, T0 + 40.0, lambda i, t: (0, 2)[i % 2])
    start = T0 + 50.0
    stuck = rows_between(start, start + 20.0, lambda i, t: 0)
    phases = {"sweep": [T0, T0 + 40.0], "adaptive": [start, start + 20.0]}
    out = score(sweep + stuck, phases, TraceClock(T0, PERIOD), interval_s=10.0)
    assert out["adaptive_over_hindsight"] == pytest.approx(45.0 / 30.0, abs=0.01)
    # aligned by each phase's start instead, the slow half of the adaptive phase would be
    # compared with the sweep's fast half: the score would be wrong
    wrong = score(sweep + stuck, phases, TraceClock(T0, None), interval_s=10.0)
    assert wrong["intervals_scored"] == 0 and "no interval" in wrong["error"]


def test_intervals_without_enough_sweep_samples_are_not_scored():
    sweep = [{"t_unix": T0 + 1.0, "split": 0, "e2e_ms": 20.0},
             {"t_unix": T0 + 2.0, "split": 0, "e2e_ms": 20.0, "error": "boom"}]
    adapt = [{"t_unix": T0 + 41.0, "split": 0, "e2e_ms": 20.0}]
    out = score(sweep + adapt, {"sweep": [T0, T0 + 40.0], "adaptive": [T0 + 40.0, T0 + 60.0]},
                TraceClock(T0, PERIOD), interval_s=10.0, min_samples=2)
    assert out["intervals_scored"] == 0 and out.get("adaptive_over_hindsight") is None
    with pytest.raises(ValueError):
        score([], {}, TraceClock(T0), interval_s=0)


def write_run(tmp_path, rows, log_rows, link=None):
    with open(tmp_path / "inferences.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, INFER_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    if link:
        with open(tmp_path / "link.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, ["t", "rate_Bps"])
            w.writeheader()
            w.writerows(link)


def test_summary_block_writes_adaptive_csv_and_the_plot(tmp_path):
    sweep = rows_between(T0, T0 + 40.0, lambda i, t: (0, 2)[i % 2])
    start = T0 + 40.0
    adapt = rows_between(start, start + 20.0, lambda i, t: 0 if fast(t) else 2)
    log_rows = [{"t_unix": r["t_unix"], "inference": r["inference"], "event": "inference",
                 "split": r["split"], "estimate_Bps": 8e6 if fast(r["t_unix"]) else 1e6}
                for r in adapt]
    log_rows.insert(len(log_rows) // 2, {"t_unix": start + 10.0, "event": "switch",
                                         "split": 2, "reason": "split 2 predicted faster"})
    decision = {"name": "adaptive", "candidates": [0, 2], "chosen": 2,
                "phases": {"sweep": [T0, T0 + 40.0], "adaptive": [start, start + 20.0]},
                "switches": [{"t_unix": start + 10.0}], "probes": {"count": 0, "ms": 0.0},
                "log": log_rows}
    summary = {"experiment": "adaptive-test",
               "partitioner": {"edge-1": {"decision": decision}}}
    link = [{"t": T0 + 20.0 * p + h, "rate_Bps": 8e6 if h == 0 else 1e6}
            for p in range(4) for h in (0, 10)]
    timeline = [{**e, "trace_t0": T0, "period_s": PERIOD} for e in link]
    write_run(tmp_path, sweep + adapt, log_rows, link)
    block = adaptive_summary(summary, sweep + adapt, tmp_path, {"interval_s": 10.0}, timeline)
    assert "log" not in decision  # moved out of summary.json into adaptive.csv
    with open(tmp_path / ADAPTIVE_FILE) as fh:
        assert len(list(csv.DictReader(fh))) == len(log_rows)
    assert block["adaptive_over_hindsight"] == pytest.approx(1.0, abs=0.01)
    assert block["best_fixed"] == 2 and block["switches"] == 1
    assert block["hindsight"]["aligned_by"].startswith("the link trace")
    assert [r["rate_Bps"] for r in block["hindsight"]["intervals"]] == [8e6, 1e6]
    summary["adaptive"] = block
    json.dumps(summary)
    png = draw_adaptive(summary, tmp_path)
    assert png is not None and png.stat().st_size > 10_000


def test_no_adaptive_partitioner_no_block(tmp_path):
    assert adaptive_summary({"partitioner": {"edge-1": {"decision": {"name": "cyclic"}}}},
                            [], tmp_path) is None


def test_results_show_prints_the_two_ratios(capsys):
    from app_api.cli.results import print_summary
    from app_api.results import build_summary

    sweep = rows_between(T0, T0 + 40.0, lambda i, t: (0, 2)[i % 2])
    adapt = rows_between(T0 + 40.0, T0 + 60.0, lambda i, t: 0 if fast(t) else 2)
    summary = build_summary([{**r, "inference": i} for i, r in enumerate(sweep + adapt)],
                            experiment="adaptive-test", run_id="r1")
    summary["partitioner"] = {"edge-1": {"decision": {
        "name": "adaptive", "candidates": [0, 2], "switches": [], "probes": {"count": 2},
        "phases": {"sweep": [T0, T0 + 40.0], "adaptive": [T0 + 40.0, T0 + 60.0]}}}}
    summary["adaptive"] = adaptive_summary(summary, sweep + adapt, None, {"interval_s": 10})
    print_summary(summary, "r")
    out = capsys.readouterr().out
    assert "adaptive_over_hindsight 0.999" in out and "adaptive_over_best_fixed 0.749" in out
    assert "best fixed split 2" in out and "2 probes" in out


def test_interleaved_phases_are_told_apart_by_inference_id():
    # one stretch of 20 s: blocks of two sweep inferences (0 and 2 in turn) and two adaptive
    rows, t, i = [], T0, 0
    ids: list[list[int]] = []
    while t < T0 + 20.0:
        sweep = i % 4 < 2
        k = (0, 2)[(i // 4) % 2] if sweep else (0 if fast(t) else 2)
        if sweep:
            ids.append([i, i])
        rows.append({"inference": i, "t_unix": t, "split": k, "e2e_ms": e2e(k, t)})
        t += e2e(k, t) / 1e3
        i += 1
    bounds = [T0, t]
    out = score(rows, {"sweep": bounds, "adaptive": bounds}, TraceClock(T0, PERIOD),
                interval_s=10.0, sweep_ids=ids)
    assert out["interleaved"] and out["intervals_scored"] == 2
    assert out["adaptive_over_hindsight"] == pytest.approx(1.0, abs=0.01)
    assert out["best_fixed"] == 2 and out["adaptive_over_best_fixed"] == pytest.approx(0.75, abs=0.01)


def test_cross_validated_best_is_not_the_luckiest_of_close_splits():
    from app_api.results.hindsight import cross_validated_best

    # two splits alike (each sample 90 or 110 ms at random): the minimum of the medians
    # picks whichever drew low (90); each half's winner scored on the other half does not
    lucky = {0: [90.0, 90.0, 90.0, 110.0, 90.0, 110.0],
             2: [110.0, 90.0, 110.0, 90.0, 110.0, 110.0]}
    assert min(statistics.median(v) for v in lucky.values()) == 90.0
    assert cross_validated_best(lucky) == pytest.approx(110.0)
    assert cross_validated_best({0: [1.0, 2.0, 3.0]}) is None
