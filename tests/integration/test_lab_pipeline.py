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
    from app_api.runner.network import lab_facts
    from app_api.runner.observer import Observer

    manifest = load_manifest("alexnet-pipeline", [f"model.name={model}", *ON_LAB, *overrides])
    return Observer(manifest, out_dir=out, progress=False, facts=lab_facts(manifest)).run()


@pytest.mark.parametrize("lab3", [(0.6, 0.6, 0.6)], indirect=True)
def test_pipeline_dp_predicts_the_throughput_it_gets(lab3, cfg):
    res = _run("alexnet", ["pipeline.modes=[throughput,latency]", "pipeline.count=32",
                           "pipeline.in_flight=4"], cfg / "run")
    assert res.ok, res.errors
    s = res.summary
    r = s["pipeline"]["ratios"]
    print(f"\nalexnet on 3 lab hosts at 0.6 core: chosen {s['pipeline']['chosen']}, "
          f"{s['throughput_per_s']:.1f}/s, bound {s['bound_per_s']:.1f}/s, ratios {r}")
    assert 0.7 < r["predicted_over_measured"] < 1.4
    assert r["throughput_over_bound"] > 0.6
    assert r["pipelined_over_single"] > 1.0  # never loses to not splitting


@pytest.mark.parametrize("lab3", [(0.6, 0.1, 0.6)], indirect=True)
def test_a_much_slower_host_gets_little_and_the_plan_beats_memory_shares(lab3, cfg):
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
    stages = {st["instance"]: st for st in planned.summary["stages"]}
    slow_share = 0.0
    if "stage-1" in stages:  # taking part at all: only a small share of the work
        total = sum(st["compute_ms"] for st in stages.values())
        slow_share = stages["stage-1"]["compute_ms"] / total
    assert "stage-1" not in chosen["chain"] or slow_share < 0.2, (chosen, stages)

    fixed = _run("mobilenet_v2", [*common, "partitioner.name=exhaustive",
                                  f"+partitioner.params.splits=[{naive.cuts[0]},{naive.cuts[1]}]",
                                  "+partitioner.params.chain=[edge-1,stage-1,cloud-1]"],
                 cfg / "naive")
    assert fixed.ok, fixed.errors
    print(f"\nslow host (0.1 core): pipeline-dp {chosen} {planned.summary['throughput_per_s']:.1f}/s"
          f" (stage-1 share {slow_share:.2f}); memory shares cuts {naive.cuts} "
          f"{fixed.summary['throughput_per_s']:.1f}/s")
    assert planned.summary["throughput_per_s"] > fixed.summary["throughput_per_s"]
