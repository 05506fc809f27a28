"""A real run's metrics: alexnet-sweep on the localhost device, samplers on both
participants, their figures in metrics.csv and summary.json."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


@pytest.mark.slow
def test_alexnet_sweep_reports_memory_cpu_and_energy_per_participant(tmp_path):
    from app_api.manifest import load_manifest
    from app_api.results import read_csv
    from app_api.runner import run_experiment

    result = run_experiment(
        load_manifest("alexnet-sweep", ["partitioner.params.repeats=2", "dataset.params.limit=2",
                                        "run.warmup=1"]),
        out_dir=tmp_path / "run", progress=False)
    assert result.ok, result.errors
    s = result.summary
    splits = {str(sp["split"]) for sp in s["splits"]}
    samples = read_csv(result.run_dir / "metrics.csv")
    assert {r["instance"] for r in samples} == {"edge-1", "cloud-1"}
    for inst in ("edge-1", "cloud-1"):
        m = s["metrics"][inst]
        assert m["samples"] > 20 and m["inferences"] == len(
            [r for r in read_csv(result.run_dir / "inferences.csv") if not r.get("error")])
        # peak RSS for every split the sweep measured, and the run's peak above them all
        per = m["memory"]["per_split_peak_rss_kb"]
        assert set(per) == splits
        assert all(0 < v <= m["memory"]["peak_rss_kb"] for v in per.values())
        assert m["memory"]["source"] == "/proc"
        assert m["cpu"]["utilization_cores"] > 0
        # every energy figure: a measured number with its method, or unsupported with why;
        # the estimate always labelled estimated, with its coefficients' source
        for name, fig in m["energy"].items():
            assert fig["method"] and fig["label"] in ("measured", "estimated"), name
            if fig["status"] == "unsupported":
                assert fig["reason"] and "j_per_inference" not in fig, name
            else:
                assert fig["status"] == "ok" and fig["j_per_inference"] > 0, (name, fig)
                assert fig["interval"][0] <= fig["j_per_inference"] <= fig["interval"][1]
        est = m["energy"]["estimate"]
        assert est["label"] == "estimated" and est["source"]
        # the reference workload at set-up and after the tasks
        runs = m["reference"]["runs"]
        assert runs[0]["at"] == "setup" and runs[-1]["at"] == "task-end"
    assert s["machine_drift"]["max_pct"] >= 0
    assert set(s["model_memory"]["activation_bytes"]) >= splits - {"0"}
