"""neurosurgeon, predicted-argmin and measured on synthetic profiles with known answers."""

from __future__ import annotations

import json
import random

import pytest

from experiment_design.errors import TracrError
from experiment_design.partitioners import (
    PartitionContext,
    create_partitioner,
    list_partitioners,
)
from experiment_design.partitioners import regression as R

# An AlexNet-shaped toy: (type, param_bytes, input_bytes); crossing bytes per split k=0..n.
LAYERS = [
    ("Conv2d", 100_000, 602_112),
    ("ReLU", 0, 800_000),
    ("MaxPool2d", 0, 800_000),
    ("Conv2d", 1_200_000, 200_000),
    ("ReLU", 0, 500_000),
    ("MaxPool2d", 0, 500_000),
    ("Linear", 40_000_000, 36_864),
    ("Linear", 4_000_000, 16_384),
]
CROSSING = [602_112, 800_000, 800_000, 200_000, 500_000, 500_000, 36_864, 16_384, 4_000]
EDGE_RATE = {"conv": 2e-5, "activation": 1e-6, "pooling": 2e-6, "linear": 1e-6}  # ms per byte


def rows(spec=LAYERS, flops=None):
    """Profile rows in SplitModel.profile() shape."""
    out = []
    for i, (t, pb, ib) in enumerate(spec):
        out.append(
            {
                "index": i + 1,
                "name": f"l{i + 1}",
                "type": t,
                "params": pb // 4,
                "param_bytes": pb,
                "flops": None if flops is None else flops[i],
                "input_shapes": [[ib // 4]],
                "output_shape": None,
                "input_bytes": ib,
                "output_bytes": CROSSING[i + 1],
                "crossing_bytes": CROSSING[i + 1],
            }
        )
    return out


def times(rates, spec=LAYERS):
    """Per-layer ms exactly linear in Eq. 2's m (so Eq. 1 fits are exact)."""
    return [
        rates[R.layer_class(t)] * R.layer_bytes({"param_bytes": pb, "input_bytes": ib})
        for t, pb, ib in spec
    ]


def ctx_for(edge_ms, cloud_ms, bandwidth, rtt=0.0, valid=None, crossing=CROSSING, layer_rows=None):
    """A PartitionContext from per-layer times and a link."""
    n = len(edge_ms)
    return PartitionContext(
        layers=layer_rows or rows(),
        points=[
            {
                "index": k,
                "layer": f"l{k}" if k else "input",
                "crossing_bytes": crossing[k],
                "valid": True,
            }
            for k in range(n + 1)
        ],
        valid_splits=list(valid if valid is not None else range(n + 1)),
        edge_profile={"layer_ms": list(edge_ms)},
        cloud_profile={"layer_ms": list(cloud_ms)},
        network={"bandwidth_Bps": float(bandwidth), "rtt_ms": rtt},
    )


def true_totals(ctx, edge_ms, cloud_ms):
    """Brute force: edge prefix + crossing/bandwidth + rtt + cloud suffix."""
    bw, rtt = ctx.network["bandwidth_Bps"], ctx.network["rtt_ms"]
    return {
        k: sum(edge_ms[:k]) + ctx.points[k]["crossing_bytes"] / bw * 1000 + rtt + sum(cloud_ms[k:])
        for k in ctx.valid_splits
    }


def decide(name, ctx, **params):
    p = create_partitioner(name, **params)
    p.setup(ctx)
    dec = p.decision()
    json.dumps(dec)  # plain JSON, always
    assert p.next_split() == dec["chosen"]
    return dec


def test_registered():
    assert {"neurosurgeon", "predicted-argmin", "measured"} <= set(list_partitioners())


EDGE = times(EDGE_RATE)
FAST_CLOUD = [e / 10 for e in EDGE]


@pytest.mark.parametrize("criterion", ["ineq3", "ineq4"])
def test_fast_cloud_slow_link_keeps_everything_on_the_edge(criterion):
    dec = decide("neurosurgeon", ctx_for(EDGE, FAST_CLOUD, bandwidth=1e3), criterion=criterion)
    assert dec["chosen"] == len(LAYERS) and dec["j_c"] is None
    assert any("all layers on the edge" in n for n in dec["notes"])
    assert dec["criterion"] == criterion


@pytest.mark.parametrize("criterion", ["ineq3", "ineq4"])
def test_fast_link_splits_at_the_input(criterion):
    dec = decide("neurosurgeon", ctx_for(EDGE, FAST_CLOUD, bandwidth=1e9), criterion=criterion)
    assert dec["chosen"] == 0 and dec["j_c"] == 1
    assert dec["scan"][0]["holds"] is True


@pytest.mark.parametrize("criterion", ["ineq3", "ineq4"])
def test_medium_link_cuts_at_the_bottleneck(criterion):
    # 2 MB/s: only the small tensor after the last pooling layer is worth sending.
    dec = decide("neurosurgeon", ctx_for(EDGE, FAST_CLOUD, bandwidth=2e6), criterion=criterion)
    assert dec["chosen"] == 6
    truth = true_totals(ctx_for(EDGE, FAST_CLOUD, bandwidth=2e6), EDGE, FAST_CLOUD)
    assert min(truth, key=truth.get) == 6


def test_when_the_cloud_is_faster_on_every_layer_ineq3_never_splits_later_than_ineq4():
    rng = random.Random(3)
    agree = 0
    for _ in range(60):
        edge = [rng.uniform(0.1, 30) for _ in LAYERS]
        cloud = [e * rng.uniform(0.05, 1.0) for e in edge]
        crossing = [rng.randrange(1_000, 1_000_000) for _ in range(len(LAYERS) + 1)]
        bw = 10 ** rng.uniform(4, 9)
        # one layer class each, so the Eq. 1 ratio models reproduce the times exactly
        spec = [
            (t, 1000 * (i + 1), 1000)
            for i, t in enumerate(
                ["Conv2d", "Linear", "MaxPool2d", "ReLU", "BatchNorm2d", "add", "Conv2d", "Linear"]
            )
        ]
        lr = rows(spec)
        c = ctx_for(edge, cloud, bw, crossing=crossing, layer_rows=lr)
        k3 = decide("neurosurgeon", c, criterion="ineq3")["chosen"]
        k4 = decide("neurosurgeon", c, criterion="ineq4")["chosen"]
        assert k3 <= k4
        agree += k3 == k4
    assert agree > 0


def test_cloud_slower_for_some_layer_types_makes_ineq4_and_ineq3_disagree():
    # The cloud is 10x faster on conv/activation/pooling but 10x slower on linear layers.
    cloud = times({"conv": 2e-6, "activation": 1e-7, "pooling": 2e-7, "linear": 1e-5})
    c = ctx_for(EDGE, cloud, bandwidth=1e9)
    d3 = decide("neurosurgeon", c, criterion="ineq3")
    d4 = decide("neurosurgeon", c, criterion="ineq4")
    # ineq4 looks only at layer j_c (conv1 is faster on the cloud) and sends everything away;
    # ineq3 sums the whole cloud suffix, sees the slow linear layers and keeps all on the edge.
    assert d4["chosen"] == 0 and d4["criterion"] == "ineq4"
    assert d3["chosen"] == len(LAYERS) and d3["criterion"] == "ineq3"
    assert d3["predicted"][d3["chosen"]] < d3["predicted"][d4["chosen"]]
    truth = true_totals(c, EDGE, cloud)
    assert min(truth, key=truth.get) == d3["chosen"]


def test_transfer_bytes_m_j_uses_the_papers_literal_term():
    c = ctx_for(EDGE, FAST_CLOUD, bandwidth=1e8)
    lit = decide("neurosurgeon", c, criterion="ineq4", transfer_bytes="m_j")
    cross = decide("neurosurgeon", c, criterion="ineq4", transfer_bytes="crossing")
    # conv1 has 100 kB of weights but its 602 kB input is what actually crosses at k=0.
    assert lit["chosen"] == 0 and lit["scan"][0]["bytes"] == 100_000
    assert cross["chosen"] == 3 and cross["scan"][0]["bytes"] == 602_112
    assert lit["transfer_bytes"] == "m_j" and cross["transfer_bytes"] == "crossing"


def test_eq1_predictions_are_exact_on_linear_profiles():
    dec = decide("neurosurgeon", ctx_for(EDGE, FAST_CLOUD, bandwidth=2e6))
    assert dec["layer_pred_ms"]["edge"] == pytest.approx(EDGE, rel=1e-6)
    assert dec["layer_pred_ms"]["cloud"] == pytest.approx(FAST_CLOUD, rel=1e-6)
    assert dec["models"]["edge"]["classes"]["conv"]["a"] == pytest.approx(2e-5, rel=1e-6)


def test_cloud_models_shipped_as_json_give_the_same_decision():
    c = ctx_for(EDGE, FAST_CLOUD, bandwidth=2e6)
    fitted = decide("neurosurgeon", c)
    shipped = json.loads(json.dumps(R.fit_bytes_models(c.layers, FAST_CLOUD)))
    c.cloud_profile = {"models": shipped}
    got = decide("neurosurgeon", c)
    assert got["chosen"] == fitted["chosen"]
    assert "shipped" in got["models"]["cloud_source"]
    assert "fitted" in fitted["models"]["cloud_source"]


def test_one_sample_per_type_falls_back_to_ratio_and_says_so():
    spec = [("Conv2d", 1000, 10), ("ReLU", 0, 10), ("Linear", 500, 10)]
    lr = rows(spec)
    c = ctx_for([3, 1, 2], [1, 1, 1], 1e9, crossing=[10, 10, 10, 10], layer_rows=lr)
    dec = decide("neurosurgeon", c)
    assert any("ratio model" in n for n in dec["notes"])


def test_invalid_splits_are_skipped():
    dec = decide("neurosurgeon", ctx_for(EDGE, FAST_CLOUD, bandwidth=1e9, valid=[1, 3, 8]))
    assert dec["chosen"] == 1
    assert set(dec["predicted"]) == {1, 3, 8}


def test_missing_measurements_are_user_errors():
    c = ctx_for(EDGE, FAST_CLOUD, bandwidth=1e9)
    c.network = None
    for name in ("neurosurgeon", "predicted-argmin"):
        with pytest.raises(TracrError, match="network"):
            decide(name, c)
    c = ctx_for(EDGE, FAST_CLOUD, bandwidth=1e9)
    c.cloud_profile = None
    with pytest.raises(TracrError, match="cloud profile"):
        decide("neurosurgeon", c)
    with pytest.raises(TracrError, match="criterion"):
        create_partitioner("neurosurgeon", criterion="ineq5")


def test_what_if_bandwidth_is_recorded_as_not_measured():
    c = ctx_for(EDGE, FAST_CLOUD, bandwidth=1e3)
    dec = decide("neurosurgeon", c, bandwidth_Bps=1e9)
    assert dec["chosen"] == 0 and "what-if" in dec["link_source"]


@pytest.mark.parametrize("seed", range(5))
def test_predicted_argmin_picks_the_true_argmin_when_predictions_are_exact(seed):
    rng = random.Random(seed)
    n = 12
    edge = [rng.uniform(0.1, 20) for _ in range(n)]
    cloud = [e * rng.uniform(0.02, 3.0) for e in edge]  # cloud sometimes slower
    crossing = [rng.randrange(1_000, 2_000_000) for _ in range(n + 1)]
    layer_rows = [{**rows([("Conv2d", 1000, 1000)])[0], "index": i + 1} for i in range(n)]
    valid = sorted(rng.sample(range(n + 1), 9))
    c = ctx_for(
        edge,
        cloud,
        10 ** rng.uniform(5, 8),
        rtt=rng.uniform(0, 5),
        valid=valid,
        crossing=crossing,
        layer_rows=layer_rows,
    )
    truth = true_totals(c, edge, cloud)
    dec = decide("predicted-argmin", c)
    assert dec["chosen"] == min(truth, key=lambda k: (truth[k], k))
    assert dec["predicted"] == pytest.approx(truth)
    assert dec["source"]["edge"]["source"] == "profile"


def test_predicted_argmin_regression_source_generalizes_from_flops():
    flops = [5_000_000, 800_000, 800_000, 60_000_000, 500_000, 500_000, 40_000_000, 4_000_000]
    lr = rows(flops=flops)
    edge = [
        2e-6 * f + 0.1 if R.layer_class(r["type"]) == "conv" else 1e-6 * f + 0.05
        for f, r in zip(flops, lr, strict=True)
    ]
    cloud = [e / 8 for e in edge]
    c = ctx_for(edge, cloud, 3e6, rtt=1.0, layer_rows=lr)
    truth = true_totals(c, edge, cloud)
    by_profile = decide("predicted-argmin", c)
    by_reg = decide("predicted-argmin", c, source="regression")
    assert by_reg["source"]["edge"]["source"] == "regression"
    assert by_reg["chosen"] == by_profile["chosen"] == min(truth, key=truth.get)
    # a layer the profile did not time is filled in by the regression
    c.edge_profile = {"layer_ms": [None if i == 3 else v for i, v in enumerate(edge)]}
    filled = decide("predicted-argmin", c)
    assert filled["source"]["edge"]["source"] == "profile+regression"
    assert filled["source"]["edge"]["regressed_layers"] == [4]
    assert filled["chosen"] == by_profile["chosen"]


def test_predicted_argmin_rtt_can_be_left_out():
    c = ctx_for(EDGE, FAST_CLOUD, 2e6, rtt=7.0)
    with_rtt = decide("predicted-argmin", c)
    without = decide("predicted-argmin", c, include_rtt=False)
    assert with_rtt["predicted"][3] - without["predicted"][3] == pytest.approx(7.0)


def test_measured_picks_the_lowest_median_of_valid_splits():
    c = ctx_for(EDGE, FAST_CLOUD, 1e6, valid=[0, 1, 2, 4, 8])
    c.measured = {"0": 50.0, "1": 31.5, "2": 31.5, "3": 1.0, "4": 40.0, "8": 33.0}
    dec = decide("measured", c)
    assert dec["chosen"] == 1 and dec["chosen_ms"] == 31.5  # 3 is not valid; ties -> lower k
    assert dec["inputs"]["ignored_invalid_splits"] == [3]


def test_measured_reads_an_earlier_runs_summary(tmp_path):
    summary = {
        "splits": [
            {"split": 0, "e2e_ms_median": 9.0},
            {"split": 5, "e2e_ms_median": 4.0},
            {"split": 8, "e2e_ms_median": None},
        ]
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    c = ctx_for(EDGE, FAST_CLOUD, 1e6)
    p = create_partitioner("measured", results=str(tmp_path))
    assert p.needs == frozenset()
    p.setup(c)
    assert p.next_split() == 5
    with pytest.raises(TracrError, match="no summary"):
        create_partitioner("measured", results=str(tmp_path / "nope")).setup(c)
    with pytest.raises(TracrError, match="no measured median"):
        decide("measured", c)


def test_profile_in_the_participants_layers_dict_form_is_accepted():
    c = ctx_for(EDGE, FAST_CLOUD, bandwidth=2e6)
    expected = decide("predicted-argmin", c)
    c.edge_profile = {"layers": {str(i + 1): v for i, v in enumerate(EDGE)}, "total_ms": sum(EDGE)}
    c.cloud_profile = {"layers": {str(i + 1): v for i, v in enumerate(FAST_CLOUD)}}
    got = decide("predicted-argmin", c)
    assert got["predicted"] == pytest.approx(expected["predicted"])
    assert got["inputs"]["edge_profile"]["layers_timed"] == len(LAYERS)
    assert decide("neurosurgeon", c)["chosen"] == 6
