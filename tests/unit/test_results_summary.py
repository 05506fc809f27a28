"""Per-split statistics from inference rows, failed rows included."""

from __future__ import annotations

from app_api.results.dispersion import best_set, mad
from app_api.results.summary import build_summary, percentile, split_stats


def row(split, e2e, edge=1.0, transfer=2.0, cloud=3.0, error="", raw=100, enc=50):
    r = {"split": split, "layer": f"l{split}", "error": error}
    if not error:
        r.update(
            e2e_ms=e2e,
            edge_ms=edge,
            encode_ms=0.5,
            transfer_ms=transfer,
            decode_ms=0.25,
            cloud_ms=cloud,
            bytes_raw=raw,
            bytes_encoded=enc,
        )
    return r


def test_percentile_interpolates():
    assert percentile([1.0], 95) == 1.0
    assert percentile([0.0, 10.0], 50) == 5.0
    assert abs(percentile(list(map(float, range(101))), 95) - 95.0) < 1e-9


def test_split_stats_medians_and_failed_rows_not_averaged():
    rows = [
        row(0, 10.0),
        row(0, 30.0),
        row(0, 20.0),
        row(1, 5.0, edge=4.0),
        row(1, None, error="link to cloud-1 failed"),
    ]
    stats = split_stats(rows)
    assert [s["split"] for s in stats] == [0, 1]
    s0, s1 = stats
    assert s0["count"] == 3 and s0["failed"] == 0 and s0["e2e_ms_median"] == 20.0
    assert s0["e2e_ms_p95"] == percentile([10.0, 20.0, 30.0], 95)
    assert s1["count"] == 1 and s1["failed"] == 1 and s1["e2e_ms_median"] == 5.0
    assert s1["edge_ms_median"] == 4.0 and s1["bytes_raw"] == 100 and s1["bytes_encoded"] == 50


def test_split_with_only_failures_has_no_latency():
    stats = split_stats([row(3, None, error="boom"), row(3, None, error="boom")])
    assert stats == [dict(stats[0], count=0, failed=2, e2e_ms_median=None)]
    assert stats[0]["transfer_ms_median"] is None


def test_build_summary_counts_best_split_and_overhead():
    rows = [row(0, 100.0), row(1, 50.0), row(2, 80.0), row(2, None, error="x")]
    s = build_summary(rows, experiment="e", run_id="r", wall_s=0.25)
    assert s["inferences"] == 4 and s["failed"] == 1
    assert s["best_split"] == 1
    assert abs(s["sum_e2e_s"] - 0.23) < 1e-9
    assert abs(s["overhead"] - 0.25 / 0.23) < 1e-9
    assert {"experiment", "run_id", "wall_s", "splits"} <= set(s)


def test_a_resumed_runs_overhead_counts_only_its_own_rows():
    """Regression: the copied rows' e2e were added to this run's sum, so a resumed run's
    overhead read below 1 (0.785 measured: wall 119 s against sum(e2e) 152 s)."""
    copied = [row(0, 100.0), row(0, 100.0)]  # timed by the run resumed
    own = [row(1, 50.0), row(1, 50.0)]
    s = build_summary(copied + own, experiment="e", run_id="r", wall_s=0.11,
                      resumed_from={"run_id": "a", "dir": "/x", "rows": 2})
    assert s["inferences"] == 4 and {x["split"] for x in s["splits"]} == {0, 1}
    assert abs(s["sum_e2e_s"] - 0.1) < 1e-9
    assert abs(s["overhead"] - 1.1) < 1e-9


def test_csv_strings_are_accepted():
    rows = [
        {
            "split": "2",
            "layer": "x",
            "error": "",
            "e2e_ms": "4.5",
            "edge_ms": "",
            "bytes_raw": "10",
            "bytes_encoded": "7",
        }
    ]
    (s,) = split_stats(rows)
    assert s["e2e_ms_median"] == 4.5 and s["edge_ms_median"] is None and s["bytes_raw"] == 10


def test_split_stats_report_the_medians_noise():
    rows = [row(0, 10.0), row(0, 30.0), row(0, 20.0), row(1, 7.0)]
    s0, s1 = split_stats(rows)
    assert s0["e2e_ms_mad"] == 10.0  # |10-20|, |30-20|, |20-20| -> median 10
    lo, hi = s0["e2e_ms_ci95"]
    assert 10.0 <= lo <= 20.0 <= hi <= 30.0
    assert split_stats(rows)[0]["e2e_ms_ci95"] == [lo, hi]  # seeded: the same every time
    # one sample: no spread to resample
    assert s1["e2e_ms_mad"] == 0.0 and s1["e2e_ms_ci95"] is None


def _noisy(center: float, spread: float, n: int = 30) -> list[float]:
    """n hand-made samples evenly over center +- spread, interleaved as repeats would be."""
    return [center + spread * ((i * 7) % n / (n - 1) * 2 - 1) for i in range(n)]


def test_best_set_of_two_clearly_separated_splits_is_the_best_alone():
    bs = best_set({3: _noisy(50.0, 2.0), 5: _noisy(40.0, 2.0)})
    assert bs["best"] == 5 and bs["splits"] == [5]
    assert bs["confidence"] == 0.95 and "bootstrap" in bs["method"]


def test_best_set_of_two_overlapping_splits_holds_both():
    samples = {3: _noisy(40.5, 5.0), 5: _noisy(40.0, 5.0), 8: _noisy(90.0, 5.0)}
    bs = best_set(samples)
    assert bs["best"] == 5 and bs["splits"] == [3, 5]
    assert best_set(samples) == bs


def test_best_set_keeps_a_split_measured_once_it_cannot_separate():
    bs = best_set({0: [100.0], 1: _noisy(40.0, 1.0), 2: []})
    assert bs["best"] == 1 and bs["splits"] == [0, 1]
    assert best_set({}) is None
    assert mad([]) is None


def test_build_summary_has_the_best_set():
    rows = [row(0, v) for v in _noisy(40.0, 2.0)] + [row(1, v) for v in _noisy(60.0, 2.0)]
    rows.append(row(1, None, error="boom"))
    s = build_summary(rows, experiment="x")
    assert s["best_split"] == 0 and s["best_set"]["splits"] == [0]
    assert s["splits"][1]["e2e_ms_ci95"][0] > s["splits"][0]["e2e_ms_ci95"][1]


def test_show_prints_the_interval_the_best_set_and_a_tie(capsys):
    from app_api.cli.results import print_summary

    rows = [row(0, v) for v in _noisy(40.0, 5.0)] + [row(1, v) for v in _noisy(40.5, 5.0)]
    s = build_summary(rows, experiment="x", run_id="r1")
    lo, hi = s["splits"][0]["e2e_ms_ci95"]
    s["partitioners"] = {"predicted-argmin": {"chosen": 1, "chosen_ms": 40.5, "best": 0,
                                              "best_ms": 40.0, "regret": 40.5 / 40.0,
                                              "in_best_set": True, "tie": True}}
    print_summary(s, "r")
    out = capsys.readouterr().out
    assert f"{lo:.2f}-{hi:.2f}" in out
    assert "best split 0; indistinguishable at 95%: 0, 1" in out
    assert "1.012 (tie)" in out
