"""Pipelines over three lab hosts: pipeline-dp's prediction and a much slower host.

The figures (predicted over measured throughput, the speed-ups) are printed (``-s``) and
reported; the assertions are the structural ones and generous sanity bounds, since the
timing targets live in ``tracr bench pipeline``.
"""

from __future__ import annotations

import subprocess

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.lab, pytest.mark.ssh, pytest.mark.slow]

ON_LAB = [
    "participant_instances.edge-1.device=lab-1",
    "participant_instances.stage-1.device=lab-2",
    "participant_instances.cloud-1.device=lab-3",
    "+participant_types.stage.settings.data_bind=0.0.0.0",
    "+participant_types.cloud.settings.data_bind=0.0.0.0",
]


@pytest.fixture
def lab3(request, cfg):
    from app_api import lab

    if subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.strip():
        pytest.skip("network namespaces already exist on this machine")
    quotas = request.param
    lab.up(hosts=3, bandwidth="32MB/s", cpu_quota=[f"lab-{i + 1}={q}" for i, q in
                                                   enumerate(quotas)])
    try:
        yield quotas
    finally:
        lab.down()


def _run(model: str, overrides: list[str], out):
    from app_api.manifest import load_manifest
    from app_api.runner.labfacts import lab_facts
    from app_api.runner.observer import Observer

    manifest = load_manifest("alexnet-pipeline", [f"model.name={model}", *ON_LAB, *overrides])
    return Observer(manifest, out_dir=out, progress=False, facts=lab_facts(manifest)).run()


def _speeds(res) -> str:
    """What a prediction that missed was made from and met: each host's start-up pass
    (wall and CPU ms), its busy loop's share alone and with all busy, the busy probe's
    factors, each configuration's throughput and the machine's drift."""
    import json

    from app_api.results import read_configs

    profiles = json.loads((res.run_dir / "profiles.json").read_text())
    hosts = "; ".join(
        f"{n} {p.get('full_ms', 0):.0f}/{p.get('full_cpu_ms', 0):.0f} ms "
        f"{(p.get('cpu_quota') or {}).get('measured')}/"
        f"{(p.get('cpu_quota') or {}).get('measured_together')} core"
        for n, p in profiles.items())
    dec = res.summary["partitioner"]["edge-1"]["decision"]
    configs = ", ".join(f"{c['mode']} {c['config']} {float(c['throughput_per_s'] or 0):.1f}/s"
                        for c in read_configs(res.run_dir))
    return (f"start-up pass wall/CPU, share alone/together: {hosts}; busy {dec.get('busy_factor')}; "
            f"predicted bottleneck {dec['placement']['bottleneck_ms']:.1f} ms; {configs}; "
            f"drift {res.summary.get('machine_drift', {}).get('by_instance')}")


@pytest.mark.parametrize("lab3", [(0.6, 0.6, 0.6)], indirect=True)
def test_pipeline_dp_predicts_the_throughput_it_gets(lab3, cfg):
    res = _run("alexnet", ["pipeline.modes=[throughput,latency]", "pipeline.count=32",
                           "pipeline.in_flight=4"], cfg / "run")
    assert res.ok, res.errors
    s = res.summary
    r = s["pipeline"]["ratios"]
    print(f"\nalexnet on 3 lab hosts at 0.6 core: chosen {s['pipeline']['chosen']}, "
          f"{s['throughput_per_s']:.1f}/s, bound {s['bound_per_s']:.1f}/s, ratios {r}")
    assert 0.7 < r["predicted_over_measured"] < 1.4, _speeds(res)
    # every member's layers were measured busy (four in flight) against its profile
    busy = s["partitioner"]["edge-1"]["decision"]["busy_factor"]
    assert set(busy) == {"edge-1", "stage-1", "cloud-1"}, busy
    assert all(0.8 <= f <= 2.0 for f in busy.values()), busy
    # plain quota: a host runs faster when the others idle (three hosts on two CPUs: 1.05-1.1)
    gains = s["partitioner"]["edge-1"]["decision"]["uncontended"]
    assert set(gains) == set(busy) and all(1.0 <= g < 1.3 for g in gains.values()), gains
    print(f"busy factors {busy}, uncontended {gains}")
    assert r["throughput_over_bound"] > 0.6
    assert r["pipelined_over_single"] > 1.0  # never loses to not splitting
    from app_api.results import read_configs

    # measured over the lab's shaped link: every configuration carries its rate
    assert {c["bandwidth"] for c in read_configs(res.run_dir)} == {"32MB/s"}


# Two runs whose every start-up step waits on the 0.1-core host (its `import torch`, its
# profile, pipeline-dp's probes): 95% of the test is that, 10 s the inferences. It took
# 235 s on a quiet machine, 354 s when the machine ran MobileNetV2 20% slower (30.9 against
# 25.5 ms a pass), and over the suite's 600 s once in a slower hour (one run's start-up
# alone 261 s against 101 s): the time scales with the machine, the assertions do not.
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("lab3", [(0.6, 0.1, 0.6)], indirect=True)
def test_a_much_slower_host_gets_little_and_the_plan_beats_memory_shares(lab3, cfg):
    import json

    from experiment_design.partitioners.pipeline import (
        DeviceFacts,
        LinkFacts,
        ModelFacts,
        full_mesh,
        proportional_placement,
    )
    from experiment_design.split import build_split_model

    sm = build_split_model("mobilenet_v2")
    names = ["edge-1", "stage-1", "cloud-1"]  # stage-1 is on lab-2, the 0.1-core host
    model = ModelFacts.from_rows(sm.profile(), [p.to_dict() for p in sm.points])
    devices = {n: DeviceFacts(n, [1.0] * sm.n, None) for n in names}
    naive = proportional_placement(model, devices, names, full_mesh(names, LinkFacts(1e9, 0)))

    common = ["pipeline.modes=[throughput]", "pipeline.count=24", "pipeline.in_flight=4",
              "pipeline.baselines=false"]
    planned = _run("mobilenet_v2", common, cfg / "dp")
    assert planned.ok, planned.errors
    chosen = planned.summary["pipeline"]["chosen"]
    # every member was profiled knowing its host's quota (only the head was, before: the
    # others' layer shares came from fastest runs that keep the quota's stalls)
    profiles = json.loads((planned.run_dir / "profiles.json").read_text())
    assert all(p.get("layers_cpu") for p in profiles.values()), list(profiles)
    # "little" is little of the work: the model's FLOPs in its range. Its share of the
    # *time* is no measure, since a throughput plan balances the stages' times (a host with
    # 0.1 of the 1.3 cores is worth ~8% of the work; CI once saw 17-25% given to it).
    flops = [row.get("flops") or 0 for row in sm.profile()]
    slow_share = 0.0
    for st in planned.summary["stages"]:
        if st["instance"] == "stage-1":
            slow_share = sum(flops[st["first"] - 1:st["last"]]) / sum(flops)
    assert slow_share <= 0.1, (chosen, planned.summary["stages"])
    ratios = planned.summary["pipeline"]["ratios"]

    fixed = _run("mobilenet_v2", [*common, "partitioner.name=exhaustive",
                                  f"+partitioner.params.cuts=[[{naive.cuts[0]},{naive.cuts[1]}]]",
                                  "+partitioner.params.chain=[edge-1,stage-1,cloud-1]"],
                 cfg / "naive")
    assert fixed.ok, fixed.errors
    print(f"\nslow host (0.1 core): pipeline-dp {chosen} {planned.summary['throughput_per_s']:.1f}/s"
          f" (stage-1 FLOP share {slow_share:.3f}, predicted/measured "
          f"{ratios['predicted_over_measured']:.2f}); memory shares cuts {naive.cuts} "
          f"{fixed.summary['throughput_per_s']:.1f}/s")
    assert planned.summary["throughput_per_s"] > fixed.summary["throughput_per_s"]


@pytest.mark.long
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("lab3", [(0.6, 0.6, 0.6)], indirect=True)
def test_pipeline_dp_choice_is_near_the_best_exhaustive_finds(lab3, cfg):
    """AlexNet on three lab hosts: ``exhaustive`` measures every cut pair of the chain, then
    the best few and pipeline-dp's choice are measured again, in turn and longer (the best of
    ~190 short measurements is biased high by noise). pipeline-dp's choice reaches 95% of the
    best; its predicted throughput is within 10% of what its choice measures in the run it
    was predicted in (192 inferences), as every run's ``predicted_over_measured`` scores it:
    the races come minutes later, and this machine's speed drifts over minutes (the same
    head's layers 1..13 took 14.1 ms of CPU a pass in pipeline-dp's run and 12.3 ms in a
    race eight minutes later). Not in the default suite (~8 minutes on 2 cores); run with
    ``-m long``."""
    import json

    from app_api.results.store import read_configs

    dp = _run("alexnet", ["pipeline.modes=[throughput]", "pipeline.count=192",
                          "pipeline.in_flight=4", "pipeline.baselines=false"], cfg / "dp")
    assert dp.ok, dp.errors
    chosen = dp.summary["pipeline"]["chosen"]
    chain = "+partitioner.params.chain=[edge-1,stage-1,cloud-1]"
    sweep = _run("alexnet", ["pipeline.modes=[throughput]", "pipeline.count=24",
                             "pipeline.in_flight=4", "pipeline.baselines=false",
                             "partitioner.name=exhaustive", chain], cfg / "exhaustive")
    assert sweep.ok, sweep.errors
    rows = [r for r in read_configs(sweep.run_dir) if r["mode"] == "throughput"]
    ranked = sorted(rows, key=lambda r: -r["throughput_per_s"])
    contenders = [tuple(r["cuts"]) for r in ranked[:3]]
    dp_cuts = tuple(chosen["cuts"])
    dp_chain = list(chosen.get("chain") or [])
    # The two hosts after the head are alike (0.6 core each), so a cut pair runs the same
    # whichever of them takes the middle: the races run on pipeline-dp's order of the
    # hosts when it chose all three, with its choice among the contenders, each in turn,
    # in the same runs (raced in runs of its own, a choice on another order read 41.1/s
    # beside 42.6-44.2/s for the contenders, where its own run had read 42.2/s: this
    # machine's speed moves 3-5% from one run to the next).
    three = len(dp_chain) == 3
    race_chain = f"+partitioner.params.chain=[{','.join(dp_chain)}]" if three else chain
    if three and dp_cuts not in contenders:
        contenders.append(dp_cuts)
    # the contenders again, each in turn, four times over, 96 inferences a time
    racing = ["pipeline.modes=[throughput]", "pipeline.count=96", "pipeline.in_flight=4",
              "pipeline.baselines=false", "partitioner.name=exhaustive"]
    cuts = "[" + ",".join(f"[{a},{b}]" for a, b in contenders) + "]"
    again: dict[tuple, list[float]] = {c: [] for c in contenders}
    dp_again: list[float] = []
    for i in range(4):
        race = _run("alexnet", [*racing, race_chain, f"+partitioner.params.cuts={cuts}"],
                    cfg / f"race-{i}")
        assert race.ok, race.errors
        for r in read_configs(race.run_dir):
            if tuple(r["cuts"]) in again and r["mode"] == "throughput":
                again[tuple(r["cuts"])].append(r["throughput_per_s"])
        if not three:  # fewer stages: its own runs, in each round
            own = _run("alexnet", [*racing, f"+partitioner.params.chain=[{','.join(dp_chain)}]",
                                   f"+partitioner.params.stages={len(dp_chain)}",
                                   "+partitioner.params.cuts=[["
                                   + ",".join(str(k) for k in dp_cuts) + "]]"],
                       cfg / f"race-dp-{i}")
            assert own.ok, own.errors
            dp_again += [r["throughput_per_s"] for r in read_configs(own.run_dir)
                         if r["mode"] == "throughput"]
    best = {c: sum(v) / len(v) for c, v in again.items()}
    top = max(best, key=best.get)
    dp_raced = best[dp_cuts] if three else sum(dp_again) / len(dp_again)
    predicted = next(c["predicted_throughput_per_s"] for c in dp.summary["pipeline"]["configs"]
                     if c["mode"] == "throughput")
    own_run = dp.summary["throughput_per_s"]
    report = {
        "configs_swept": len(rows), "sweep_top3": [(r["cuts"], round(r["throughput_per_s"], 2))
                                                   for r in ranked[:3]],
        "raced": {str(list(c)): round(v, 2) for c, v in best.items()},
        "pipeline_dp": {"cuts": list(dp_cuts), "chain": dp_chain,
                        "predicted_per_s": predicted, "measured_per_s": round(own_run, 2),
                        "raced_per_s": round(dp_raced, 2)},
        "dp_over_best": round(dp_raced / best[top], 3),
        "predicted_over_measured": round(predicted / own_run, 3) if predicted else None,
        "predicted_over_raced": round(predicted / dp_raced, 3) if predicted else None,
    }  # fmt: skip
    print("\nEXHAUSTIVE " + json.dumps(report, indent=2))
    assert dp_raced >= 0.95 * best[top], report
    assert predicted and abs(predicted / own_run - 1) <= 0.10, report
