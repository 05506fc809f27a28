"""The manifest's network section, bandwidth groups, and the throttle-aware edge model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiment_design.errors import TracrError
from experiment_design.partitioners import PartitionContext, create_partitioner
from experiment_design.partitioners.predicted import calibration, fit_cpu_scale, throttled_ms


def _manifest(overrides=()):
    from app_api.manifest import load_manifest

    # no lab in unit tests: the lab-N devices exist only while a lab is up
    local = ["participant_instances.edge-1.device=localhost",
             "participant_instances.cloud-1.device=localhost"]
    return load_manifest("neurosurgeon-alexnet", [*local, *overrides])


def test_requested_bandwidths_list_single_and_override():
    from app_api.runner.plan import requested_bandwidths

    assert requested_bandwidths(_manifest()) == ["1MB/s", "4MB/s", "16MB/s", "64MB/s"]
    # a bandwidth on the command line wins over the file's list: one run
    assert requested_bandwidths(_manifest(["network.bandwidth=16MB/s"])) == ["16MB/s"]
    assert requested_bandwidths(_manifest(["network.bandwidths=null"])) == ["4MB/s"]
    none = _manifest(["network.bandwidths=null", "network.bandwidth=null"])
    assert requested_bandwidths(none) is None


def test_shaping_refused_without_a_lab(monkeypatch):
    from app_api.runner import shaping

    # the lab's state lives in /run, shared by the whole machine: whether a lab is up
    # elsewhere must not decide this test
    monkeypatch.setattr(shaping, "lab_hosts", lambda: [])
    with pytest.raises(TracrError, match="no tracr lab is up"):
        shaping.check_lab_participants(_manifest())


def test_shaping_refused_for_participants_off_the_lab(monkeypatch):
    from app_api.runner import shaping

    monkeypatch.setattr(shaping, "lab_hosts", lambda: ["lab-1", "lab-2"])
    with pytest.raises(TracrError, match=r"not every participant is on a lab device "
                       r"\(cloud-1 on localhost, edge-1 on localhost\)"):
        shaping.check_lab_participants(_manifest())


def test_cli_refuses_bandwidth_off_lab_with_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "app", "experiment", "run", "alexnet-sweep",
         "--set", "network.bandwidth=4MB/s", "--no-progress"],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
    )
    assert proc.returncode == 2, proc.stderr
    assert "lab" in proc.stderr and "Traceback" not in proc.stderr


def test_bandwidth_dir_names():
    from app_api.runner.plan import bandwidth_dir_name

    assert bandwidth_dir_name("4MB/s") == "bw-4MBps"
    assert bandwidth_dir_name("100Mbit") == "bw-100Mbit"


def _summary(best, parts):
    return {
        "run_id": "r1", "status": "ok", "best_split": best,
        "splits": [{"split": best, "layer": "features.5", "e2e_ms_median": 80.0}],
        "network": {"lab": {"bandwidth_Bps": 3.9e6, "rtt_ms": 0.05}},
        "partitioners": parts,
    }


def test_group_summary_is_listed_found_and_shown(tmp_path, monkeypatch, capsys):
    from app_api.cli.results import print_group
    from app_api.results import find_run, list_runs
    from app_api.results.store import load_group
    from app_api.runner.bandwidths import group_row, write_group

    monkeypatch.setenv("TRACR_RESULTS_DIR", str(tmp_path))
    gdir = tmp_path / "neurosurgeon-alexnet" / "20260101T000000000Z-abcdef"
    (gdir / "bw-4MBps").mkdir(parents=True)
    parts = {"predicted-argmin": {"chosen": 6, "chosen_ms": 80.0, "regret": 1.0},
             "neurosurgeon": {"chosen": 3, "chosen_ms": 98.0, "regret": 1.225}}
    row = group_row("4MB/s", _summary(6, parts), gdir / "bw-4MBps", gdir)
    assert row["run"] == "bw-4MBps" and row["bandwidth_Bps"] == 4e6
    assert row["best"] == 6 and row["best_ms"] == 80.0 and row["measured_Bps"] == 3.9e6
    doc = {"kind": "bandwidth-group", "experiment": "neurosurgeon-alexnet",
           "group_id": gdir.name, "model": "alexnet", "bandwidths": ["4MB/s", "16MB/s"],
           "status": "ok", "rows": [row], "errors": [], "wall_s": 1.0}
    write_group(gdir, doc)
    assert load_group(gdir)["rows"][0]["best"] == 6
    assert find_run("neurosurgeon-alexnet") == gdir
    assert find_run(str(gdir)) == gdir
    assert [r["summary"]["kind"] for r in list_runs()] == ["group"]
    print_group(doc, gdir)
    out = capsys.readouterr().out
    assert "4MB/s" in out and "3 (1.225)" in out and "6 (1.000)" in out
    assert "not run: 16MB/s" in out


def test_cli_results_show_prints_a_group(tmp_path):
    from app_api.runner.bandwidths import write_group

    gdir = tmp_path / "g"
    gdir.mkdir()
    write_group(gdir, {"kind": "bandwidth-group", "experiment": "x", "group_id": "g",
                       "bandwidths": ["1MB/s"], "status": "ok", "errors": [],
                       "rows": [{"bandwidth": "1MB/s", "best": 13, "best_layer": "features.12",
                                 "best_ms": 150.0, "status": "ok",
                                 "partitioners": {"measured": {"chosen": 13, "regret": 1.0}}}]})
    proc = subprocess.run([sys.executable, "-m", "app", "results", "show", str(gdir)],
                          capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stderr
    assert "13 (features.12)" in proc.stdout and "13 (1.000)" in proc.stdout
    js = subprocess.run([sys.executable, "-m", "app", "results", "show", str(gdir), "--json"],
                        capture_output=True, text=True, timeout=60,
                        cwd=Path(__file__).parents[2])
    assert json.loads(js.stdout)["rows"][0]["best"] == 13


def test_throttle_model():
    # no quota, or a burst that fits in the period's quota after an idle spell: full speed
    assert throttled_ms(40.0, 0.0, 100.0, 100.0) == 40.0
    assert throttled_ms(10.0, 90.0, 25.0, 100.0) == pytest.approx(10.0)
    # back to back, a quarter of a core: about four times the CPU time
    assert 3.5 * 40 < throttled_ms(40.0, 0.0, 25.0, 100.0) < 5 * 40
    # longer bursts never get faster
    walls = [throttled_ms(c, 20.0, 25.0, 100.0) for c in (5, 20, 40, 80, 160)]
    assert walls == sorted(walls)
    scale = fit_cpu_scale(20.0, throttled_ms(40.0, 0.0, 25.0, 100.0), 25.0, 100.0)
    assert scale == pytest.approx(2.0, rel=0.1)


def test_calibration_scales_to_full_pass():
    assert calibration({"full_ms": 30.0}, [5.0, 10.0, None]) == pytest.approx(2.0)
    assert calibration({}, [5.0, 10.0]) == 1.0


def _ctx(edge_profile):
    layers = [{"index": i, "name": f"l{i}", "type": "Conv2d", "params": 10, "param_bytes": 40,
               "flops": 1000, "input_bytes": 100, "output_bytes": 100} for i in range(1, 5)]
    cross = {0: 400_000, 1: 300_000, 2: 200_000, 3: 20_000, 4: 1_000}
    points = [{"index": k, "layer": f"l{k}", "crossing_bytes": b, "valid": True}
              for k, b in cross.items()]
    cloud = {"layers": {str(i): 1.0 for i in range(1, 5)}, "full_ms": 4.0}
    return PartitionContext(layers=layers, points=points, valid_splits=list(cross),
                            edge_profile=edge_profile, cloud_profile=cloud,
                            network={"bandwidth_Bps": 4e6, "rtt_ms": 0.1})


def test_predicted_argmin_sees_the_quota_stall():
    edge = {"layers": {"1": 5.0, "2": 5.0, "3": 5.0, "4": 60.0}, "full_ms": 300.0,
            "cpu_quota": {"quota_ms": 25.0, "period_ms": 100.0, "fraction": 0.25}}
    p = create_partitioner("predicted-argmin")
    p.setup(_ctx(edge))
    dec = p.decision()
    # split 4 spends 75 ms of CPU at a quarter of a core: it stalls for most of a period;
    # the short prefixes that fit in the period's quota are predicted at full speed
    assert dec["chosen"] in (2, 3)
    assert dec["predicted_parts"][2]["edge_stall_ms"] == pytest.approx(0.0, abs=1e-6)
    assert dec["predicted_parts"][4]["edge_stall_ms"] > 50
    assert dec["source"]["edge"]["throttle"]["quota_ms"] == 25.0
    assert create_partitioner("predicted-argmin", throttle=False) is not None


def test_throttle_model_with_a_short_period_is_an_even_slowdown():
    # A 10 ms period (the lab's default): the same quarter of a core stalls for at most a
    # period or two, so any burst long against the period takes ~ cpu / fraction whatever
    # the idle time before it, i.e. the stall model degrades to a uniform slowdown by itself.
    for idle in (0.0, 7.0, 33.0, 90.0):
        for cpu in (5.0, 20.0, 40.0, 80.0, 160.0):
            wall = throttled_ms(cpu, idle, 2.5, 10.0)
            assert abs(wall - 4 * cpu) <= 2 * 10.0 + 1e-6, (idle, cpu, wall)
            if cpu >= 40:
                assert 0.85 * 4 * cpu <= wall <= 1.05 * 4 * cpu, (idle, cpu, wall)
    # with the old 100 ms period a 40 ms burst after a long idle spell is far off uniform
    assert throttled_ms(40.0, 90.0, 25.0, 100.0) < 0.75 * 4 * 40
    # the CPU scale fitted to back-to-back passes is the uniform one as well
    assert fit_cpu_scale(20.0, 4 * 40.0, 2.5, 10.0) == pytest.approx(2.0, rel=0.05)


def test_predicted_argmin_throttle_on_or_off_agree_with_a_short_period():
    # per-layer medians of an evenly slowed edge (10 ms period): 4 x the unthrottled time
    edge = {"layers": {"1": 20.0, "2": 20.0, "3": 20.0, "4": 240.0}, "full_ms": 300.0,
            "cpu_quota": {"quota_ms": 2.5, "period_ms": 10.0, "fraction": 0.25}}
    on = create_partitioner("predicted-argmin")
    on.setup(_ctx(edge))
    off = create_partitioner("predicted-argmin", throttle=False)
    off.setup(_ctx(dict(edge)))
    d_on, d_off = on.decision(), off.decision()
    assert d_on["source"]["edge"]["throttle"]["period_ms"] == 10.0
    assert d_on["chosen"] == d_off["chosen"]
    for k in range(1, 5):
        a, b = d_on["predicted"][k], d_off["predicted"][k]
        assert abs(a - b) <= max(0.1 * b, 20.0), (k, a, b)


def test_predicted_argmin_reads_the_edge_prefix_off_the_cold_curve():
    from experiment_design.partitioners.predicted import cold_prefix_of, edge_after_idle

    # per-layer medians from back-to-back passes say layer 2 is slow (a stall landed there);
    # passes after an idle spell show where the time really goes: layer 4
    edge = {"layers": {"1": 2.0, "2": 40.0, "3": 2.0, "4": 20.0}, "full_ms": 80.0,
            "prefix_cold_ms": {"1": 2.0, "2": 5.0, "3": 7.0, "4": 70.0}, "cold_gap_ms": 20.0,
            "cpu_quota": {"quota_ms": 2.5, "period_ms": 10.0, "fraction": 0.25}}
    p = create_partitioner("predicted-argmin")
    p.setup(_ctx(edge))
    dec = p.decision()
    assert dec["source"]["edge"]["throttle"]["model"] == "cold prefix curve"
    # split 3 idles 6.1 ms (20 KB on the wire, 1 cloud layer): 61% of a period, so its
    # prefix lies 61% of the way from the back-to-back rate (7 * 80/70) to the cold time
    assert dec["predicted_parts"][3]["edge_ms"] == pytest.approx(0.61 * 7 + 0.39 * 8)
    # split 2 idles 52 ms: read straight off the curve
    assert dec["predicted_parts"][2]["edge_ms"] == pytest.approx(5.0)
    assert dec["chosen"] == 3
    # the same profile without the curve: the stall-model path, which the cold param turns on
    off = create_partitioner("predicted-argmin", cold=False)
    off.setup(_ctx(dict(edge)))
    assert off.decision()["source"]["edge"]["throttle"].get("model") != "cold prefix curve"

    cold = cold_prefix_of(edge, 4)
    assert cold == [0.0, 2.0, 5.0, 7.0, 70.0]
    # made non-decreasing; a missing layer means no curve
    assert cold_prefix_of({"prefix_cold_ms": {"1": 3.0, "2": 2.0}}, 2) == [0.0, 3.0, 3.0]
    assert cold_prefix_of({"prefix_cold_ms": {"1": 3.0}}, 2) is None
    assert cold_prefix_of({}, 2) is None
    # idle for a period or more: the cold time; back to back: the rate of full passes
    assert edge_after_idle(cold, 3, 15.0, 10.0, 80.0) == pytest.approx(7.0)
    assert edge_after_idle(cold, 3, 0.0, 10.0, 80.0) == pytest.approx(7.0 * 80.0 / 70.0)
    assert edge_after_idle(cold, 3, 5.0, 10.0, 80.0) == pytest.approx(7.0 * (1 + 80 / 70) / 2)


def test_profile_records_a_cold_prefix_curve():
    import torch

    from experiment_design.roles.profiling import profile_split_model
    from experiment_design.split import build_split_model

    torch.manual_seed(0)
    sm = build_split_model("alexnet", seed=0, input_shape=(3, 64, 64))
    x = torch.randn(1, 3, 64, 64)
    prof = profile_split_model(sm, x, repeats=2, full_repeats=2, cold_repeats=3, cold_gap_ms=1.0)
    cold = prof["prefix_cold_ms"]
    assert sorted(map(int, cold)) == list(range(1, sm.n + 1))
    # cumulative from the start of each pass: never decreasing past a layer's own time
    assert cold[str(sm.n)] >= max(cold.values()) * 0.999
    assert (prof["cold_gap_ms"], prof["cold_repeats"]) == (1.0, 3)
    none = profile_split_model(sm, x, repeats=1, full_repeats=1, cold_repeats=0)
    assert "prefix_cold_ms" not in none


def test_under_a_quota_the_profile_times_each_layers_cpu_time():
    import time

    import torch

    from experiment_design.roles.profiling import profile_split_model
    from experiment_design.split import build_split_model

    torch.manual_seed(0)
    x = torch.randn(1, 3, 64, 64)
    quota = {"quota_ms": 1.2, "period_ms": 2.0, "fraction": 0.6, "source": "lab", "mode": "duty"}
    for mode in ("graph", "hooks"):
        sm = build_split_model("alexnet", seed=0, input_shape=(3, 64, 64), mode=mode)
        c0 = time.process_time()
        prof = profile_split_model(sm, x, repeats=3, full_repeats=2, cold_repeats=0, quota=quota)
        spent = (time.process_time() - c0) * 1e3
        cpu = prof["layers_cpu"]
        assert sorted(map(int, cpu)) == list(range(1, sm.n + 1))
        assert all(v >= 0 for v in cpu.values())
        # a pass's layers add up to about its CPU time (and less than all the profiling)
        assert 0.5 * prof["full_cpu_ms"] < sum(cpu.values()) < spent
        assert "layers_cpu" not in profile_split_model(sm, x, repeats=1, full_repeats=1,
                                                       cold_repeats=0)


def test_predicted_argmin_adds_the_hand_off_stall_to_prefixes_past_the_budget():
    from experiment_design.partitioners.predicted import handoff_ms, prefix_cpu_of

    # the cold curve alone makes split 3 the best (7 ms on the edge, 20 KB on the wire);
    # the hand-off measured at start-up says a prefix past the 2.5 ms budget waits ~7.5 ms
    # more when it gives up the CPU to send, and split 1 (1 ms of CPU) owes nothing
    edge = {"layers": {"1": 2.0, "2": 40.0, "3": 2.0, "4": 20.0}, "full_ms": 80.0,
            "layers_min": {"1": 1.0, "2": 2.0, "3": 2.0, "4": 15.0}, "full_cpu_ms": 20.0,
            "prefix_cold_ms": {"1": 2.0, "2": 5.0, "3": 7.0, "4": 70.0}, "cold_gap_ms": 20.0,
            "cpu_quota": {"quota_ms": 2.5, "period_ms": 10.0, "fraction": 0.25},
            "handoff": [{"split": 1, "cpu_ms": 1.0, "stall_ms": 0.0},
                        {"split": 3, "cpu_ms": 5.0, "stall_ms": 7.5},
                        {"split": 4, "cpu_ms": 20.0, "stall_ms": 8.0}]}
    assert prefix_cpu_of(edge, 4) == pytest.approx([0.0, 1.0, 3.0, 5.0, 20.0])
    assert handoff_ms(edge, 0.0) == 0.0 and handoff_ms(edge, 1.0) == 0.0
    assert handoff_ms(edge, 3.0) == pytest.approx(3.75)
    assert handoff_ms(edge, 50.0) == pytest.approx(8.0)
    assert handoff_ms({}, 5.0) == 0.0

    def fast(profile):  # 64 MB/s: the 400 KB input crosses in 6.3 ms
        ctx = _ctx(profile)
        ctx.network = {"bandwidth_Bps": 64e6, "rtt_ms": 0.1}
        return ctx

    with_it = create_partitioner("predicted-argmin")
    with_it.setup(fast(edge))
    without = create_partitioner("predicted-argmin", handoff=False)
    without.setup(fast(dict(edge)))
    on, off = with_it.decision()["predicted_parts"], without.decision()["predicted_parts"]
    assert on[3]["edge_handoff_ms"] == pytest.approx(7.5) and on[0]["edge_handoff_ms"] == 0.0
    assert on[3]["edge_ms"] == pytest.approx(off[3]["edge_ms"] + 7.5)
    assert on[3]["transfer_ms"] == off[3]["transfer_ms"]  # the wire is the wire
    # without it split 3 looks fastest; with it, split 1 (a prefix inside the budget) is
    assert without.decision()["chosen"] == 3 and with_it.decision()["chosen"] == 1
    assert with_it.decision()["source"]["edge"]["throttle"]["handoff"] == edge["handoff"]
