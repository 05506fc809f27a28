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


def _stage(hop, name, first, last, compute, cpu, transfer, **planned):
    return {"hop": hop, "instance": name, "first": first, "last": last, "compute_ms": compute,
            "cpu_ms": cpu, "transfer_ms": transfer, "stage_ms": compute + transfer,
            "utilization": 0.9, "bubble_ms": 5.0, "queue_mean": 0.5, "bytes_out": 1024,
            **planned}


def _pipeline_summary(configs, chosen, partitioner=None):
    s = build_summary([row(16, 50.0)], experiment="p", run_id="r1")
    s["pipeline"] = {"configs": configs, "chosen": chosen, "best_single": "edge-1",
                     "ratios": {"throughput_over_bound": 1.02, "pipelined_over_sequential": 2.5,
                                "pipelined_over_single": 1.6, "predicted_over_measured": 0.9}}
    s["partitioner"] = partitioner or {}
    return s


def _config(cuts, mode, thr, stages=()):
    return {"cuts": cuts, "chain": ["edge-1", "stage-1", "cloud-1"][: len(cuts) + 1],
            "mode": mode, "in_flight": 4 if mode == "throughput" else 1, "inferences": 48,
            "throughput_per_s": thr, "bound_per_s": thr * 0.98,
            "predicted_throughput_per_s": 45.0, "latency_ms_p50": 70.0,
            "bytes_per_inference": 2048, "stages": list(stages)}


def test_show_prints_a_pipelines_configurations_ratios_and_stages_planned_and_measured(capsys):
    """`results show` of a pipeline run: every configuration against its bound and the
    prediction, the run's ratios, and the chosen one's stages with the plan's figures beside
    the measured ones (before: only the head's split table, none of the pipeline)."""
    from app_api.cli.results import print_summary

    planned = [_stage(0, "edge-1", 1, 16, 8.96, 5.61, 9.89, predicted_compute_ms=12.10,
                      predicted_overhead_ms=6.23, predicted_stage_ms=18.33),
               _stage(1, "stage-1", 17, 77, 12.62, 8.05, 1.65, predicted_compute_ms=13.86,
                      predicted_overhead_ms=7.04, predicted_stage_ms=20.90),
               _stage(2, "cloud-1", 78, 153, 14.91, 8.95, 0.0, predicted_compute_ms=18.74,
                      predicted_overhead_ms=2.70, predicted_stage_ms=21.44)]
    chosen = {"cuts": [16, 77], "chain": ["edge-1", "stage-1", "cloud-1"], "mode": "throughput"}
    s = _pipeline_summary([_config([16, 77], "throughput", 56.69, planned),
                           _config([16, 77], "latency", 19.88)], chosen)
    print_summary(s, "r")
    out = capsys.readouterr().out
    assert "edge-1>stage-1>cloud-1" in out and "throughput *" in out and "56.69" in out
    assert "throughput / bound: 1.020" in out and "predicted / measured: 0.900" in out
    assert "pipelined / best single (edge-1): 1.600" in out
    stage_line = next(ln for ln in out.splitlines() if "stage-1" in ln and "17..77" in ln)
    for figure in ("12.62", "13.86", "8.05", "7.04", "1.65", "20.90", "0.90"):
        assert figure in stage_line, (figure, stage_line)


def test_show_takes_an_older_runs_plan_from_its_decision_and_trims_a_sweep(capsys):
    from app_api.cli.results import print_summary
    from app_api.cli.results_pipeline import MAX_CONFIGS

    stages = [_stage(0, "edge-1", 1, 16, 9.0, 5.5, 9.9), _stage(1, "stage-1", 17, 153, 20.0,
                                                                  11.0, 0.0)]
    chosen = {"cuts": [16], "chain": ["edge-1", "stage-1"], "mode": "throughput"}
    decision = {"placement": {"cuts": [16], "chain": ["edge-1", "stage-1"],
                              "objective": "throughput", "compute_ms": [11.0, 21.0],
                              "overhead_ms": [4.0, 2.0], "transfer_ms": [16.0, 0.1]}}
    sweep = [_config([k], "throughput", 30.0 + k / 10) for k in range(1, MAX_CONFIGS + 11)
             if k != 16]
    s = _pipeline_summary([_config([16], "throughput", 52.0, stages), *sweep], chosen,
                          {"edge-1": {"decision": decision}})
    print_summary(s, "r")
    out = capsys.readouterr().out
    head = next(ln for ln in out.splitlines() if "edge-1" in ln and "1..16" in ln)
    assert "11.00" in head and "4.00" in head and "16.00" in head  # max(11 + 4, 16)
    assert "23.00" in next(ln for ln in out.splitlines() if "17..153" in ln)  # 21 + 2
    assert f"5 of {MAX_CONFIGS + 10} configurations" in out  # the chosen is the fastest


def _pair(split, transport, e2e):
    return {**row(split, e2e), "transport": transport}


def test_a_codec_sweep_takes_its_per_split_figures_from_the_runs_own_transport():
    # codec-sweep-lab at 4 MB/s: AlexNet's input sent as JPEG took 20 ms, raw 175 ms and
    # zstd-1 70 ms; cut 3 int4 21, zstd-1 42, raw 66 ms. Pooled over the transports, the
    # split medians ranked 0 first (29.8 ms, no transport's cost) and predicted-argmin
    # was scored against that (regret 1.29-1.36); with zstd-1 alone 3 is the best split.
    rows = []
    for _ in range(4):
        rows += [_pair(0, "jpeg-q50", 20.0), _pair(0, "zstd-1", 70.0), _pair(0, "raw", 175.0),
                 _pair(0, "int4+zstd-1", 21.0), _pair(0, "webp-q90", 24.0),
                 _pair(3, "int4+zstd-1", 21.0), _pair(3, "zstd-1", 42.0), _pair(3, "raw", 66.0)]
    s = build_summary(rows, transport="zstd-1", experiment="x")
    assert s["split_transport"]["label"] == "zstd-1"
    assert s["inferences"] == len(rows) and s["split_transport"]["inferences"] == 8
    assert [(r["split"], r["count"], r["e2e_ms_median"]) for r in s["splits"]] == [
        (0, 4, 70.0), (3, 4, 42.0)]
    assert s["best_split"] == 3 and s["best_set"]["splits"] == [3]
    # the run's transport not swept: the first lossless one
    other = [r for r in rows if r["transport"] != "zstd-1"]
    assert build_summary(other, transport="zstd-1")["split_transport"]["label"] == "raw"
    # one transport (an ordinary run): nothing to choose, every row counts
    plain = [r for r in rows if r["transport"] == "raw"]
    assert "split_transport" not in build_summary(plain, transport="raw")
