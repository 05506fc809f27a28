"""The partitioners on AlexNet's real split points and profile rows (no processes, no network)."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest

torch = pytest.importorskip("torch")
split = pytest.importorskip("experiment_design.split")

from app_api.results.scoring import bandwidth_what_if, evaluate_partitioners  # noqa: E402
from experiment_design.partitioners import PartitionContext, create_partitioner  # noqa: E402
from experiment_design.partitioners import regression as R  # noqa: E402


@pytest.fixture(scope="module")
def alexnet():
    torch.set_num_threads(1)
    return split.build_split_model("alexnet")


def _ctx(sm, edge_ms, cloud_ms, bandwidth, rtt=1.0):
    return PartitionContext(
        layers=sm.profile(),
        points=[dataclasses.asdict(p) for p in sm.points],
        valid_splits=sm.valid_splits(),
        edge_profile={"layer_ms": edge_ms},
        cloud_profile={"layer_ms": cloud_ms},
        network={"bandwidth_Bps": bandwidth, "rtt_ms": rtt},
    )


def _flops_times(sm, gflops_per_s):
    # a device that does `gflops_per_s` GFLOP/s plus 20 us per layer
    return [(r["flops"] or 0) / (gflops_per_s * 1e6) + 0.02 for r in sm.profile()]


def test_every_alexnet_layer_gets_a_regression_class(alexnet):
    classes = {R.layer_class(r["type"]) for r in alexnet.profile()}
    assert {"conv", "activation", "pooling", "linear", "other"} <= classes
    assert R.layer_class("flatten") == "other" and R.layer_class("Dropout") == "other"


def test_split_moves_towards_the_input_as_bandwidth_grows(alexnet):
    ctx = _ctx(alexnet, _flops_times(alexnet, 2), _flops_times(alexnet, 40), 4e6)
    out = bandwidth_what_if(["predicted-argmin", "neurosurgeon"], ctx, [1e5, 1e6, 4e6, 16e6, 1e9])
    for name in ("predicted-argmin", "neurosurgeon"):
        chosen = [out[bw][name]["chosen"] for bw in sorted(out)]
        assert chosen == sorted(chosen, reverse=True), (name, chosen)
        assert chosen[-1] == 0  # a very fast link: send the input
    assert out[1e5]["predicted-argmin"]["chosen"] >= 13  # a slow link: past the last pooling


def test_predictions_against_a_known_sweep(alexnet):
    edge, cloud = _flops_times(alexnet, 2), _flops_times(alexnet, 40)
    ctx = _ctx(alexnet, edge, cloud, 4e6)
    bw, rtt = 4e6, 1.0
    truth = {
        k: sum(edge[:k]) + alexnet.points[k].crossing_bytes / bw * 1e3 + rtt + sum(cloud[k:])
        for k in alexnet.valid_splits()
    }
    ev = evaluate_partitioners(
        [
            "predicted-argmin",
            "neurosurgeon",
            "measured",
            {
                "name": "neurosurgeon",
                "label": "neurosurgeon-ineq4",
                "params": {"criterion": "ineq4"},
            },
        ],
        ctx,
        truth,
    )
    json.dumps(ev)
    assert ev["predicted-argmin"]["regret"] == pytest.approx(1.0)
    assert ev["predicted-argmin"]["spearman"] == pytest.approx(1.0)
    assert ev["measured"]["regret"] == 1.0
    for name in ("neurosurgeon", "neurosurgeon-ineq4"):
        assert ev[name]["chosen"] in alexnet.valid_splits()
        assert ev[name]["regret"] >= 1.0 and ev[name]["spearman"] is not None


def test_real_profile_of_alexnet_on_this_machine(alexnet):
    x = torch.randn(1, 3, 224, 224)
    with torch.inference_mode():
        alexnet.run_full(x, timed=True)  # warm-up, not used
        runs = [alexnet.run_full(x, timed=True)[1] for _ in range(3)]
    per = {}
    for run in runs:
        for idx, ms in run:
            per.setdefault(idx, []).append(ms)
    edge = [statistics.median(per[i]) for i in range(1, len(alexnet.layers) + 1)]
    # the "cloud" is the same profile scaled: 8x faster
    ctx = _ctx(alexnet, edge, [e / 8 for e in edge], 4e6)
    for name in ("neurosurgeon", "predicted-argmin"):
        p = create_partitioner(name)
        p.setup(ctx)
        dec = json.loads(json.dumps(p.decision()))
        assert dec["chosen"] in alexnet.valid_splits()
        assert len(dec["predicted"]) == len(alexnet.valid_splits())
    models = R.fit_bytes_models(ctx.layers, edge)
    assert models["classes"]["conv"]["n"] == 5 and models["classes"]["conv"]["model"] == "linear"
