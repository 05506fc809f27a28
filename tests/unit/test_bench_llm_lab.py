"""`tracr bench llm --placement` without a lab: placement from measured host figures, the
runs' overrides, the pipeline's bound and the report's keys, targets and verdicts. Pure:
no torch, no processes."""

from __future__ import annotations

import argparse
import dataclasses
import math

import pytest

from app_api.bench.llm_hosts import (
    HostFacts,
    host_from_probe,
    link_from_report,
    split_resolution,
)
from app_api.bench.llm_lab import (
    Generation,
    Measured,
    add_arguments,
    caps_result,
    facts_keys,
    placement_overrides,
    single_result,
)
from experiment_design.errors import TracrError
from experiment_design.partitioners.llm_placement import (
    Link,
    compare,
    time_per_token,
    tracr_placement,
)
from experiment_design.runtime.decode_probe import DecodeProbe
from tests.unit.test_llm_placement import MB, QWEN  # Qwen2.5-0.5B's figures, in one place

LINK = Link(rate_bytes_per_s=1e9, rtt_ms=0.1)
CHAIN = ["head-1", "stage-1", "stage-2"]


def probe(layer_ms: float, head_ms: float, embed_ms: float = 0.1) -> DecodeProbe:
    return DecodeProbe("qwen2.5-0.5b-config", 2, 512, 12, embed_ms, layer_ms, head_ms,
                       565 * MB, (layer_ms,) * 24)


def facts(cap: int | None) -> list[HostFacts]:
    """What the probes measure on the lab's hosts (0.6 / 0.6 / 0.15 core): a layer at
    full speed 5.4 ms, the LM head 37 ms."""
    return [HostFacts(n, q, cap, probe(5.4 / q, 37.0 / q))
            for n, q in (("lab-1", 0.6), ("lab-2", 0.6), ("lab-3", 0.15))]


def gen(tpot: float, total: float, stages=(("head-1", 30.0, 0.5),)) -> Generation:
    return Generation(tpot, 1000 / tpot, total, 2 * tpot, tuple(stages))


def test_a_host_from_its_probe_costs_every_layer_what_the_probe_measured():
    h = host_from_probe(facts(1600 * MB)[2], 24)
    assert h.layer_ms == pytest.approx((36.0,) * 24) and h.head_ms == pytest.approx(246.67, abs=0.01)
    assert h.embed_ms == 0.1
    # the process's own memory counts against the cap beside its weights
    assert h.cap_bytes == 1600 * MB and h.runtime_bytes == 565 * MB


def test_measured_figures_under_caps_force_a_split_that_beats_memory_shares():
    hosts = [host_from_probe(f, QWEN.n) for f in facts(1600 * MB)]
    plans = compare(QWEN, hosts, LINK)
    t, mp = plans["tracr"], plans["memory-proportional"]
    assert t.fits and len(t.stages) == 3
    # the slow host holds the embedding (a lookup) and the least it can
    assert t.hosts[0] == "lab-3" and t.stages[0].b == 1
    assert mp.ms_per_token / t.ms_per_token > 2.0


def test_without_caps_the_measured_figures_keep_the_model_on_one_fast_host():
    hosts = [host_from_probe(f, QWEN.n) for f in facts(None)]
    t = tracr_placement(QWEN, hosts, LINK)
    assert t.hosts in (["lab-1"], ["lab-2"]) and "fastest" in t.reason


def test_the_lab_link_must_have_been_measured():
    assert link_from_report({"bandwidth_Bps": 3e8, "rtt_ms": 0.05}) == Link(3e8, 0.05)
    with pytest.raises(TracrError, match="no measured link"):
        link_from_report({"bandwidth_Bps": None, "rtt_ms": None})


def test_a_probe_round_trips_through_json():
    p = probe(9.0, 61.0)
    assert DecodeProbe.from_dict(p.to_dict()) == p


def test_a_placement_becomes_the_manifests_devices_chain_and_cuts():
    hosts = [host_from_probe(f, QWEN.n) for f in facts(1600 * MB)]
    t = tracr_placement(QWEN, hosts, LINK)
    out = placement_overrides(t, CHAIN, [{"max_new_tokens": 8, "sequences": 1}])
    assert out[:3] == ["participant_instances.head-1.device=lab-3",
                       "participant_instances.stage-1.device=lab-1",
                       "participant_instances.stage-2.device=lab-2"]
    assert "pipeline.chain=[head-1, stage-1, stage-2]" in out
    assert out[-1] == ("playbook.head-1=[{task: generate, params: {max_new_tokens: 8, "
                       f"sequences: 1, cuts: [{t.cuts[0]}, {t.cuts[1]}]}}}}, {{task: finish}}]")


def test_a_one_host_placement_drops_the_other_members():
    one = time_per_token(QWEN, [host_from_probe(facts(None)[1], 24)], [0, 24], LINK)
    out = placement_overrides(one, CHAIN, [{"sequences": 1}])
    assert "participant_instances.head-1.device=lab-2" in out
    assert {"~participant_instances.stage-1", "~playbook.stage-1",
            "~participant_instances.stage-2", "~playbook.stage-2",
            "~pipeline"} <= set(out)
    assert "cuts: []" in out[-1]


def test_the_bound_is_the_slowest_stages_compute_and_send_per_token():
    g = gen(300.0, 6.0, [("head-1", 30.0, 1.0), ("stage-1", 140.0, 2.0),
                         ("stage-2", 135.0, 0.5)])
    assert g.slowest == ("stage-1", 142.0)
    assert g.bound_per_s == pytest.approx(1000 / 142)


def test_the_capped_report_has_each_policy_and_each_target_with_its_verdict():
    hosts = [host_from_probe(f, QWEN.n) for f in facts(1600 * MB)]
    plans = compare(QWEN, hosts, LINK)
    stages = [("head-1", 36.0, 0.3), ("stage-1", 140.0, 0.3), ("stage-2", 130.0, 0.3)]
    measured = {
        "memory-proportional": Measured(plans["memory-proportional"], gen(700.0, 1.3), "a"),
        "equal-slices": Measured(plans["equal-slices"], gen(700.0, 1.3), "a",
                                 same_run_as="memory_proportional"),
        "tracr": Measured(plans["tracr"], gen(320.0, 2.9), "b", gen(330.0, 6.5, stages)),
    }
    r = caps_result(measured)
    for p in ("memory_proportional", "equal_slices", "tracr"):
        for k in ("hosts", "cuts", "predicted_ms_per_token", "tpot_ms_p50", "tokens_per_s",
                  "tokens_per_s_total", "run_dir"):
            assert f"{p}_{k}" in r
    assert r["equal_slices_same_run_as"] == "memory_proportional"
    assert r["tracr_speedup_over_memory_proportional"] == pytest.approx(700 / 320)
    assert r["in_flight_over_bound"] == pytest.approx(6.5 / (1000 / 140.3))
    assert r["in_flight_over_one_sequence"] == pytest.approx(6.5 / 2.9)
    assert set(r["targets"]) == set(r["met"]) == {
        "tracr_speedup_over_memory_proportional", "in_flight_over_bound",
        "in_flight_over_one_sequence"}
    assert r["met"] == {"tracr_speedup_over_memory_proportional": True,
                        "in_flight_over_bound": True, "in_flight_over_one_sequence": True}
    # a figure short of its target is reported as such, never raised to meet it
    slow = {**measured, "tracr": Measured(plans["tracr"], gen(500.0, 2.0), "b",
                                          gen(510.0, 2.5, stages))}
    r = caps_result(slow)
    assert r["met"] == {"tracr_speedup_over_memory_proportional": False,
                        "in_flight_over_bound": False, "in_flight_over_one_sequence": False}


def test_the_uncapped_report_compares_tracr_with_the_best_single_host():
    hosts = [host_from_probe(f, QWEN.n) for f in facts(None)]
    ones = {h.name: time_per_token(QWEN, [h], [0, 24], LINK, policy=f"single {h.name}")
            for h in hosts}
    singles = {"lab-1": Measured(ones["lab-1"], gen(290.0, 3.3), "1"),
               "lab-2": Measured(ones["lab-2"], gen(285.0, 3.4), "2"),
               "lab-3": Measured(ones["lab-3"], gen(1150.0, 0.8), "3")}
    t = tracr_placement(QWEN, hosts, LINK)
    r = single_result(Measured(t, gen(285.0, 3.4), "2", same_run_as="single_lab-2"), singles)
    assert r["best_single_host"] == "lab-2"
    assert r["tracr_over_best_single"] == 1.0 and r["met"] == {"tracr_over_best_single": True}
    assert r["single_lab-3_tpot_ms_p50"] == 1150.0 and r["tracr_same_run_as"] == "single_lab-2"
    r = single_result(Measured(t, gen(300.0, 3.2), "x"), singles)
    assert r["met"] == {"tracr_over_best_single": False}


def test_placements_run_twice_count_the_mean_and_name_the_hosts_they_cannot_tell_apart():
    # the mirrored order (lab-1, lab-2, lab-3, then lab-2, lab-1 again): a machine that
    # slowed over the runs made lab-2's first run look 2% slower than lab-1's
    hosts = [host_from_probe(f, QWEN.n) for f in facts(None)]
    ones = {h.name: time_per_token(QWEN, [h], [0, 24], LINK, policy=f"single {h.name}")
            for h in hosts}
    singles = {"lab-1": Measured(ones["lab-1"], gen(293.0, 3.3), "1", again=gen(305.0, 3.2)),
               "lab-2": Measured(ones["lab-2"], gen(299.0, 3.3), "2", again=gen(297.0, 3.3)),
               "lab-3": Measured(ones["lab-3"], gen(1150.0, 0.8), "3")}
    t = tracr_placement(QWEN, hosts, LINK)
    tracr = dataclasses.replace(singles["lab-2"], placement=t, same_run_as="single_lab-2")
    r = single_result(tracr, singles)
    assert r["single_lab-1_tpot_ms_runs"] == [293.0, 305.0]
    assert r["single_lab-1_tpot_ms_p50"] == 299.0 and r["single_lab-2_tpot_ms_p50"] == 298.0
    assert r["best_single_host"] == "lab-2" and r["met"] == {"tracr_over_best_single": True}
    assert r["run_to_run_pct"] == pytest.approx(100 * 12 / 299)
    assert r["best_single_tied"] == ["lab-1", "lab-2"]
    assert r["single_lab-3_tpot_ms_runs"] == [1150.0]


def test_the_report_says_which_measured_figures_the_placement_used():
    out = facts_keys(facts(1600 * MB), LINK, 512)
    assert out["placement_from"].startswith("measured")
    assert out["host_lab-3_layer_ms"] == pytest.approx(36.0)
    assert out["host_lab-1_cap_bytes"] == 1600 * MB and out["link_rtt_ms"] == 0.1


def test_the_placement_options_parse():
    p = argparse.ArgumentParser()
    add_arguments(p)
    a = p.parse_args(["--placement", "--no-caps", "--in-flight", "3"])
    assert a.placement and a.no_caps and a.in_flight == 3
    assert a.manifest == "llm-placement-lab"


def test_the_split_margin_is_two_standard_errors_of_the_noisiest_hosts_median():
    steady = HostFacts("lab-1", 0.6, None, probe(9.0, 60.0))  # every sample alike: 0
    assert split_resolution([steady]) == 0.0
    samples = tuple(9.0 + (i % 4) * 0.3 for i in range(24))  # IQR 0.6 ms
    noisy = HostFacts("lab-2", 0.6, None, dataclasses.replace(
        probe(9.3, 60.0), layer_samples=samples))
    expected = 2 * 1.2533 * (0.6 / 1.349) / math.sqrt(24) / 9.3
    assert split_resolution([steady, noisy]) == pytest.approx(expected)
