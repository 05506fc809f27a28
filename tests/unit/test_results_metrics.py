"""The participants' samples summarised: peak RSS per split, CPU, throttling, energy per
inference (or why not), the machine's drift, and the model's activation bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app_api.results import read_csv
from app_api.results.metrics import MetricsLog, metrics_summary, write_metrics

REPO = Path(__file__).resolve().parents[2]


def _info(rapl_reason: str = "no powercap tree") -> dict:
    return {
        "interval_ms": 50.0, "cpus": 2, "peak_method": "VmHWM reset per sample",
        "sources": {"memory": "/proc", "cpu": "os.times", "frequency": "sysfs",
                    "throttling": "/sys/fs/cgroup/lab/cpu.stat"},
        "energy": {
            "rapl": {"method": "rapl", "label": "measured", "kind": "counter",
                     "status": "unsupported", "reason": rapl_reason},
            "nvml": {"method": "nvml", "label": "measured", "kind": "counter",
                     "status": "supported"},
            "estimate": {"method": "estimate", "label": "estimated", "kind": "power",
                         "idle_w": 2.0, "max_w": 6.0, "source": "datasheet",
                         "status": "supported"},
        },
        "reference": {"work": "mm", "runs": [{"at": "setup", "ms": 2.0},
                                             {"at": "task-end", "ms": 2.1}]},
    }


def _log() -> tuple[MetricsLog, list[dict]]:
    """4 s of samples at 50 ms; split 3 for 2 s (10 inferences), then split 7 for 2 s, with
    a 200 MB peak between two samples during split 7 and a 10 W GPU."""
    samples = []
    for i in range(81):
        t = 100.0 + i * 0.05
        rss = 500_000
        hwm = 700_000 if i == 60 else rss
        samples.append({"t_unix": t, "rss_kb": rss, "hwm_kb": hwm, "cpu_s": 0.5 * (t - 100),
                        "freq_mhz": 1500.0 + i, "nr_throttled": i // 10,
                        "throttled_us": 1000.0 * i, "nvml_j": 10.0 * (t - 100),
                        "estimate_w": 4.0})
    rows = []
    for n in range(20):
        rows.append({"inference": n, "split": 3 if n < 10 else 7, "t_unix": 100.0 + n * 0.2,
                     "e2e_ms": 150.0})
    rows.append({"inference": 20, "split": 7, "error": "boom"})  # failed: not counted
    log = MetricsLog()
    log.add("edge-1", samples[:40], _info())
    log.add("edge-1", samples[40:], None)
    return log, rows


def test_peak_rss_per_split_catches_the_peak_between_samples():
    log, rows = _log()
    m = metrics_summary(log, rows)["metrics"]["edge-1"]
    mem = m["memory"]
    assert mem["peak_rss_kb"] == 700_000
    assert mem["per_split_peak_rss_kb"] == {"3": 500_000, "7": 700_000}
    assert "VmHWM reset per sample" in mem["per_split_method"]


def test_cpu_throttling_and_frequency_over_the_inferences():
    log, rows = _log()
    m = metrics_summary(log, rows)["metrics"]["edge-1"]
    assert m["inferences"] == 20
    assert m["cpu"]["utilization_cores"] == pytest.approx(0.5, abs=0.01)
    assert m["cpu"]["utilization_share"] == pytest.approx(0.25, abs=0.01)
    assert m["cpu"]["frequency"]["source"] == "sysfs"
    thr = m["throttling"]
    assert thr["throttled_ms"] == pytest.approx(78.0, abs=2.0)  # 1 ms per sample
    assert thr["throttled_ms_per_inference"] == pytest.approx(thr["throttled_ms"] / 20)


def test_energy_per_inference_names_its_method_and_never_invents_a_number():
    log, rows = _log()
    e = metrics_summary(log, rows)["metrics"]["edge-1"]["energy"]
    assert e["rapl"]["status"] == "unsupported" and e["rapl"]["reason"] == "no powercap tree"
    assert "j_per_inference" not in e["rapl"]
    # 10 W over the window (100.0 .. 103.95 s) shared by 20 inferences
    assert e["nvml"]["status"] == "ok" and e["nvml"]["label"] == "measured"
    assert e["nvml"]["j_per_inference"] == pytest.approx(10.0 * 3.95 / 20)
    lo, hi = e["nvml"]["interval"]
    assert lo <= e["nvml"]["j_per_inference"] <= hi
    assert e["estimate"]["label"] == "estimated" and e["estimate"]["source"] == "datasheet"
    assert e["estimate"]["j_per_inference"] == pytest.approx(4.0 * 3.95 / 20)


def test_energy_per_split_needs_twenty_samples_per_split():
    log, rows = _log()
    per = metrics_summary(log, rows)["metrics"]["edge-1"]["energy_per_split"]["nvml"]
    assert per["3"]["status"] == "ok" and per["3"]["samples"] >= 20
    assert per["3"]["j_per_inference"] == pytest.approx(10.0 * 1.95 / 10, rel=0.05)
    short = [r for r in rows if r.get("split") == 3][:3]
    per = metrics_summary(log, short)["metrics"]["edge-1"]["energy_per_split"]["nvml"]
    assert per["3"]["status"] == "insufficient" and "20 needed" in per["3"]["reason"]


def test_the_machine_drift_is_stated():
    log, rows = _log()
    s = metrics_summary(log, rows)
    assert s["metrics"]["edge-1"]["reference"]["drift_pct"] == pytest.approx(5.0)
    assert s["machine_drift"]["max_pct"] == pytest.approx(5.0)


def test_metrics_csv_holds_every_sample_with_its_energy_columns(tmp_path):
    log, _ = _log()
    path = write_metrics(tmp_path, log)
    rows = read_csv(path)
    assert len(rows) == 81 and rows[0]["instance"] == "edge-1"
    assert {"rss_kb", "hwm_kb", "throttled_us", "nvml_j", "estimate_w"} <= set(rows[0])
    assert write_metrics(tmp_path / "none", MetricsLog()) is None


@pytest.mark.slow
def test_activation_bytes_in_the_profile_equal_what_model_splits_reports():
    """Per layer k: the activation bytes alive after it (the model profile, what a run's
    summary carries as model_memory) equal ``tracr model splits``' crossing bytes."""
    from experiment_design.split import build_split_model

    proc = subprocess.run([sys.executable, "app.py", "model", "splits", "alexnet", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    cli = {r["index"]: r["crossing_bytes"] for r in json.loads(proc.stdout)}
    profile = build_split_model("alexnet", seed=0).profile()
    assert len(profile) == len(cli) - 1  # cut 0 (the input) has no layer
    for row in profile:
        assert row["activation_bytes"] == cli[row["index"]], row["name"]
    mem = metrics_summary(MetricsLog(), [], profile)["model_memory"]
    assert mem["activation_bytes"] == {str(k): v for k, v in cli.items() if k}
    assert mem["param_bytes"] == sum(r["param_bytes"] for r in profile)


def test_results_show_flags_a_ranking_the_machine_drift_could_explain():
    from app_api.results.drift import drift_flag
    from app_api.results.metrics import metrics_lines

    log, rows = _log()
    s = metrics_summary(log, rows)
    s["splits"] = [{"split": 3, "e2e_ms_median": 100.0}, {"split": 7, "e2e_ms_median": 104.0}]
    assert "ranking could be the machine's" in drift_flag(s)  # 5% drift, 4% gap
    s["splits"][1]["e2e_ms_median"] = 120.0
    assert drift_flag(s) is None
    lines = metrics_lines(s)
    assert lines[0].startswith("edge-1: peak RSS 684 MiB")
    assert "rapl unsupported: no powercap tree" in lines[0]
    assert "estimate" in lines[0] and "(estimated)" in lines[0]


def test_results_compare_says_when_the_best_moved_within_the_machine_drift(tmp_path):
    from app_api.results.compare import _drift

    for name, pct in (("a", 2.0), ("b", 6.0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(
            json.dumps({"machine_drift": {"max_pct": pct}}))
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert _drift(dirs, 0.05) == {"machine_drift_pct": [2.0, 6.0], "drift_could_explain": True}
    assert _drift(dirs, 0.08)["drift_could_explain"] is False
    assert _drift([str(tmp_path / "none")], 0.05)["drift_could_explain"] is None


def _two_participants() -> dict:
    log, rows = _log()
    cloud = [{**r, "nvml_j": 2 * r["nvml_j"]} for r in log.samples["edge-1"]]
    log.add("cloud-1", cloud, _info())
    s = metrics_summary(log, rows)
    s["splits"] = [{"split": 3, "e2e_ms_median": 150.0}, {"split": 7, "e2e_ms_median": 120.0}]
    return s


def test_energy_per_split_sums_the_participants_and_keeps_the_label():
    s = _two_participants()
    by = s["energy_by_split"]
    assert set(by) == {"nvml", "estimate"}  # rapl was unsupported: no figure at all
    nvml = by["nvml"]
    assert nvml["3"]["participants"] == ["cloud-1", "edge-1"]
    assert nvml["3"]["label"] == "measured" and by["estimate"]["3"]["label"] == "estimated"
    one = s["metrics"]["edge-1"]["energy_per_split"]["nvml"]["3"]["j_per_inference"]
    assert nvml["3"]["j_per_inference"] == pytest.approx(3 * one)
    lo, hi = nvml["3"]["interval"]
    assert lo <= nvml["3"]["j_per_inference"] <= hi


def test_participants_on_one_device_count_its_energy_once():
    from app_api.results.energy import energy_by_split

    s = _two_participants()
    same = energy_by_split(s["metrics"], {"edge-1": "localhost", "cloud-1": "localhost"})
    assert same["nvml"]["3"]["participants"] == ["cloud-1"]
    cloud = s["metrics"]["cloud-1"]["energy_per_split"]["nvml"]["3"]["j_per_inference"]
    assert same["nvml"]["3"]["j_per_inference"] == pytest.approx(cloud)


def test_partitioners_are_scored_on_energy_with_a_measured_collector_first():
    from app_api.results.energy import score_energy

    s = _two_participants()
    s["partitioners"] = {"neurosurgeon": {"chosen": 3, "best": 7}, "broken": {"error": "x"}}
    score_energy(s)
    e = s["partitioners"]["neurosurgeon"]["energy"]
    assert e["method"] == "nvml" and e["label"] == "measured"
    assert e["frugal_split"] in (3, 7) and e["energy_regret"] >= 1.0
    assert e["chosen_j"] == pytest.approx(s["energy_by_split"]["nvml"]["3"]["j_per_inference"])
    assert "energy" not in s["partitioners"]["broken"]


def test_the_latency_energy_front():
    from app_api.results.energy import energy_front, energy_front_lines

    s = _two_participants()
    s["energy_by_split"]["nvml"]["7"]["j_per_inference"] = 100.0  # faster but costlier
    doc = energy_front(s)
    assert doc["method"] == "nvml" and {p["split"] for p in doc["points"]} == {3, 7}
    assert sorted(doc["front"]) == [3, 7]
    s["energy_by_split"]["nvml"]["7"]["j_per_inference"] = 0.01  # faster and cheaper
    assert energy_front(s)["front"] == [7]
    assert energy_front(s, "estimate")["points"][0]["label"] == "estimated"
    assert "* split   7" in "\n".join(energy_front_lines(energy_front(s)))
    empty = energy_front({"splits": s["splits"]})
    assert empty["points"] == [] and "20 samples" in energy_front_lines(empty)[0]


def test_a_lab_hosts_throttling_is_read_by_the_observer_from_its_cgroup(tmp_path,
                                                                        monkeypatch):
    """Inside a lab host the participant cannot see its cgroup; the observer reads the
    host's cpu.stat (named by the lab's state) at every poll instead."""
    from app_api.lab import state as lab_state
    from app_api.runner.hoststat import lab_cpu_stat

    cg = tmp_path / "cgroup/tracr-lab-1"
    cg.mkdir(parents=True)
    (cg / "cpu.stat").write_text("nr_periods 10\nnr_throttled 2\nthrottled_usec 1000\n")
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps({"version": lab_state.STATE_VERSION, "hosts": [
        {"name": "lab-1", "cgroup": str(cg)}, {"name": "lab-2"}]}))
    monkeypatch.setattr(lab_state, "state_path", lambda: state_file)
    assert lab_cpu_stat("lab-1") == cg / "cpu.stat"
    assert lab_cpu_stat("lab-2") is None and lab_cpu_stat("localhost") is None

    log, rows = _log()
    own = [{k: v for k, v in r.items() if k not in ("nr_throttled", "throttled_us")}
           for r in log.samples["edge-1"]]
    info = {**_info(), "sources": {**_info()["sources"], "throttling": "none"}}
    lab = MetricsLog()
    lab.add("edge-1", [], info, lambda: lab_cpu_stat("lab-1"))  # before the inferences
    lab.host_throttle["edge-1"][-1]["t_unix"] = 99.0
    lab.add("edge-1", own, None)
    lab.host_throttle["edge-1"][-1]["t_unix"] = 102.0  # during them
    (cg / "cpu.stat").write_text("nr_periods 90\nnr_throttled 42\nthrottled_usec 81000\n")
    lab.add("edge-1", [], None)  # after them
    lab.host_throttle["edge-1"][-1]["t_unix"] = 105.0
    thr = metrics_summary(lab, rows)["metrics"]["edge-1"]["throttling"]
    assert thr["nr_throttled"] == 40 and thr["throttled_ms"] == pytest.approx(80.0)
    assert "observer" in thr["source"] and "tracr-lab-1" in thr["source"]
