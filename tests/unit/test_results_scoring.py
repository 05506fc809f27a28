"""Scoring partitioners against a measured sweep: regret, Spearman, partitioners.json."""

from __future__ import annotations

import json
import statistics

import pytest

from app_api.results.dispersion import best_set
from app_api.results.scored import split_choices
from app_api.results.scoring import (
    bandwidth_what_if,
    evaluate_partitioners,
    evaluate_run,
    spearman,
    summary_view,
    write_partitioners_json,
)
from experiment_design.partitioners import PartitionContext


def test_spearman_hand_checked():
    # ranks a = 1 2 3 4 5, ranks b = 2 1 4 3 5: d^2 = 1+1+1+1+0 = 4; rho = 1 - 6*4/(5*24) = 0.8
    assert spearman([1, 2, 3, 4, 5], [20, 10, 40, 30, 50]) == pytest.approx(0.8)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [10, 11, 500]) == pytest.approx(1.0)
    # ties: a ranks 1.5 1.5 3 ; b ranks 1 2 3 -> pearson = 0.8660254
    assert spearman([5, 5, 7], [1, 2, 3]) == pytest.approx(0.8660254, rel=1e-6)
    assert spearman([1], [2]) is None
    assert spearman([4, 4, 4], [1, 2, 3]) is None


def _ctx():
    """3 layers; the cloud is 10x faster; crossing bytes shrink after layer 2."""
    layers = [
        {
            "index": i + 1,
            "name": f"l{i + 1}",
            "type": t,
            "params": 0,
            "param_bytes": pb,
            "flops": None,
            "input_bytes": ib,
            "output_bytes": 0,
        }
        for i, (t, pb, ib) in enumerate(
            [("Conv2d", 1000, 4000), ("ReLU", 0, 4000), ("Linear", 3000, 400)]
        )
    ]
    return PartitionContext(
        layers=layers,
        points=[
            {"index": k, "crossing_bytes": b, "valid": True}
            for k, b in enumerate([4000, 4000, 400, 40])
        ],
        valid_splits=[0, 1, 2, 3],
        edge_profile={"layer_ms": [10.0, 1.0, 6.0]},
        cloud_profile={"layer_ms": [1.0, 0.1, 0.6]},
        network={"bandwidth_Bps": 1e6, "rtt_ms": 0.5},
    )


def test_evaluate_regret_and_spearman():
    ctx = _ctx()
    # predicted-argmin (profile): k=0: 4+.5+1.7=6.2  k=1: 10+4.5+.7=15.2  k=2: 11+.9+.6=12.5  k=3: 17.54
    measured = {0: 8.0, 1: 16.0, 2: 12.0, 3: 20.0}
    ev = evaluate_partitioners(["predicted-argmin", "measured", "neurosurgeon"], ctx, measured)
    pa = ev["predicted-argmin"]
    assert pa["predicted"] == pytest.approx({0: 6.2, 1: 15.2, 2: 12.5, 3: 17.54})
    assert pa["chosen"] == 0 and pa["best"] == 0 and pa["best_ms"] == 8.0
    assert pa["regret"] == pytest.approx(1.0)
    # predicted order 0,2,1,3 ; measured order 0,2,1,3 -> rho = 1
    assert pa["spearman"] == pytest.approx(1.0)
    assert ev["measured"]["chosen"] == 0 and ev["measured"]["regret"] == 1.0
    ns = ev["neurosurgeon"]
    assert ns["criterion"] == "ineq3" and ns["chosen"] in measured
    assert ns["regret"] == pytest.approx(measured[ns["chosen"]] / 8.0)
    json.dumps(ev)


def test_evaluate_regret_above_one_and_labels_with_params():
    ctx = _ctx()
    measured = {0: 30.0, 1: 16.0, 2: 12.0, 3: 20.0}  # the link turned out slower than probed
    ev = evaluate_partitioners(
        [
            "predicted-argmin",
            {"name": "neurosurgeon", "label": "ns-ineq4", "params": {"criterion": "ineq4"}},
        ],
        ctx,
        measured,
    )
    pa = ev["predicted-argmin"]
    assert pa["chosen"] == 0 and pa["best"] == 2
    assert pa["regret"] == pytest.approx(30.0 / 12.0)
    # predicted ranks (0,1,2,3) = 1,3,2,4 ; measured = 4,2,1,3 ; d^2 = 9+1+1+1 = 12 -> 1 - 72/60
    assert pa["spearman"] == pytest.approx(-0.2)
    assert ev["ns-ineq4"]["criterion"] == "ineq4"


def test_evaluate_reports_errors_per_partitioner_and_unmeasured_choices():
    ctx = _ctx()
    ctx.cloud_profile = None
    ev = evaluate_partitioners(["neurosurgeon", "measured"], ctx, {0: 5.0, 3: 4.0})
    assert "cloud profile" in ev["neurosurgeon"]["error"]
    assert ev["measured"]["chosen"] == 3
    ctx = _ctx()
    # a sweep over some splits: the partitioners choose among the measured ones
    ev = evaluate_partitioners(["predicted-argmin"], ctx, {1: 5.0, 3: 4.0})
    assert ev["predicted-argmin"]["chosen"] in (1, 3)
    assert ev["predicted-argmin"]["regret"] >= 1.0
    # no measured split is a valid one: the choice is reported as not measured
    ev = evaluate_partitioners(["predicted-argmin"], ctx, {99: 5.0})
    assert ev["predicted-argmin"]["chosen_ms"] is None and ev["predicted-argmin"]["regret"] is None
    assert any("not measured" in n for n in ev["predicted-argmin"]["notes"])
    view = summary_view(ev)
    assert set(view["predicted-argmin"]) >= {"chosen", "regret", "spearman", "best"}


def test_bandwidth_what_if_moves_the_split_earlier_as_the_link_gets_faster():
    ctx = _ctx()
    out = bandwidth_what_if(["predicted-argmin", "neurosurgeon", "measured"], ctx, [1e3, 1e5, 1e9])
    chosen = [out[bw]["predicted-argmin"]["chosen"] for bw in (1e3, 1e5, 1e9)]
    assert chosen == sorted(chosen, reverse=True)
    assert chosen[0] == 3 and chosen[-1] == 0
    assert "measured" not in out[1e3]
    ctx.cloud_profile = None
    assert "error" in bandwidth_what_if(["neurosurgeon"], ctx, [1e3])[1e3]["neurosurgeon"]


def test_write_partitioners_json(tmp_path):
    ctx = _ctx()
    ev = evaluate_partitioners(["predicted-argmin"], ctx, {0: 1.0, 1: 2.0})
    path = write_partitioners_json(tmp_path, ctx, evaluation=ev)
    doc = json.loads(path.read_text())
    assert doc["inputs"]["network"]["bandwidth_Bps"] == 1e6
    assert doc["inputs"]["edge_profile"]["layer_ms"] == [10.0, 1.0, 6.0]
    assert doc["evaluation"]["predicted-argmin"]["chosen"] == 0


def test_evaluate_run_is_the_observers_one_call(tmp_path):
    ctx = _ctx()
    splits = [
        {"split": 0, "e2e_ms_median": 8.0},
        {"split": 1, "e2e_ms_median": 16.0},
        {"split": 2, "e2e_ms_median": 12.0},
        {"split": 3, "e2e_ms_median": None},
    ]
    view = evaluate_run(
        ["predicted-argmin", "measured"], json.loads(json.dumps(ctx.to_dict())), splits, tmp_path
    )
    assert view["predicted-argmin"] == {
        "chosen": 0,
        "chosen_ms": 8.0,
        "best": 0,
        "best_ms": 8.0,
        "regret": 1.0,
        "spearman": pytest.approx(1.0),
        # predicted 6.2 / 15.2 / 12.5 ms against 8 / 16 / 12: two of three within 10%
        "within_10pct": pytest.approx(2 / 3),
        "criterion": "argmin predicted edge + transfer + cloud",
    }
    assert view["measured"]["chosen"] == 0
    doc = json.loads((tmp_path / "partitioners.json").read_text())
    assert doc["what_if_bandwidths"] == {}
    evaluate_run(["predicted-argmin", "measured"], ctx, splits, tmp_path, bandwidths_Bps=[1e3, 1e9])
    doc = json.loads((tmp_path / "partitioners.json").read_text())
    assert doc["what_if_bandwidths"]["1000.0"]["predicted-argmin"]["chosen"] == 3
    assert doc["what_if_bandwidths"]["1000000000.0"]["predicted-argmin"]["chosen"] == 0


def test_split_half_regret_measures_how_much_the_oracle_moves_with_noise():
    from app_api.results.noise import split_half_regret

    # clear winner: both halves pick split 2, whose median is best in the other half too
    clear = {0: [10.0, 11.0, 10.0, 11.0], 1: [8.0, 8.5, 8.0, 8.5], 2: [5.0, 5.2, 5.1, 5.0]}
    assert split_half_regret(clear)["regret"] == pytest.approx(1.0)
    # a near tie flipped by noise: the halves disagree, each choice is 20% worse on the other
    noisy = {0: [5.0, 6.0, 5.0, 6.0], 1: [6.0, 5.0, 6.0, 5.0]}
    out = split_half_regret(noisy)
    assert out["a_on_b"] == pytest.approx(1.2) and out["b_on_a"] == pytest.approx(1.2)
    assert out["regret"] == pytest.approx(1.2)
    assert (out["splits"], out["repeats_min"], out["repeats_max"]) == (2, 4, 4)
    # halves are dealt alternately, so with 3 repeats they hold 2 and 1 values
    assert split_half_regret({0: [1.0, 9.0, 3.0], 1: [4.0, 4.0, 4.0]})["a_on_b"] == \
        pytest.approx(9.0 / 4.0)
    # a split measured once (or only one split) gives no estimate
    assert split_half_regret({0: [1.0], 1: [2.0, 3.0]}) is None
    assert split_half_regret({}) is None


def test_measurement_noise_reads_inference_rows_and_skips_failures():
    from app_api.results.noise import measurement_noise

    rows = [{"split": k, "e2e_ms": v, "error": ""} for k, v in
            [(0, 5.0), (1, 6.0), (0, 6.0), (1, 5.0)]]
    rows.append({"split": 0, "e2e_ms": None, "error": "link to cloud-1 failed"})
    assert measurement_noise(rows)["regret"] == pytest.approx(1.2)
    assert measurement_noise(rows[:2]) is None


def test_measurement_noise_says_how_far_the_contenders_alone_move():
    """A walk of 3 repeats over 40 splits, then 12 more over two contenders: a walk split's
    lucky lone sample wins half B, so the headline counts that winner's curse; the
    contenders' own figure compares the splits that stayed in the running."""
    from app_api.results.noise import measurement_noise

    rows = []
    for k in range(40):
        # split 7's second sample (its only one in half B) is a lucky 5.0, its others 30:
        # never a contender
        rows += [{"split": k, "e2e_ms": v} for v in
                 ([30.0, 5.0, 30.0] if k == 7 else [20.0 + k, 21.0 + k, 22.0 + k])]
    for i in range(15):
        rows += [{"split": 0, "e2e_ms": 10.0 + (i % 3)}, {"split": 1, "e2e_ms": 10.2 + (i % 3)}]
    noise = measurement_noise(rows)
    assert noise["b_on_a"] == pytest.approx(30.0 / 11.0)  # half B's best is split 7
    among = noise["contenders"]
    assert among["splits"] == 2 and among["repeats_min"] == among["repeats_max"] == 18
    assert among["regret"] == pytest.approx(1.0)
    # every split measured as often: no second figure
    assert "contenders" not in measurement_noise(rows[:120])


def _spread(center: float, n: int = 25) -> list[float]:
    """n hand-made samples evenly over center +- 4 ms, interleaved as repeats would be."""
    return [center + 8.0 * ((i * 7) % n / (n - 1) - 0.5) for i in range(n)]


def test_a_choice_the_sweep_cannot_tell_from_the_best_is_a_tie_with_its_regret_kept():
    ctx = _ctx()  # predicted-argmin picks split 0 (predicted 6.2 ms)
    # split 0 is the runner-up, within the noise of split 2; 1 and 3 are far behind
    samples = {0: _spread(12.5), 1: _spread(30.0), 2: _spread(12.0), 3: _spread(40.0)}
    bs = best_set(samples)
    assert bs["best"] == 2 and bs["splits"] == [0, 2]
    medians = {k: statistics.median(v) for k, v in samples.items()}
    ev = evaluate_partitioners(["predicted-argmin"], ctx, medians, best_set=bs["splits"])
    pa = ev["predicted-argmin"]
    assert pa["chosen"] == 0 and pa["best"] == 2
    assert pa["regret"] == pytest.approx(12.5 / 12.0) and pa["regret"] > 1.0
    assert pa["tie"] is True and pa["in_best_set"] is True
    assert summary_view(ev)["predicted-argmin"]["tie"] is True


def test_a_choice_separated_from_the_best_is_no_tie():
    ctx = _ctx()
    samples = {0: _spread(30.0), 1: _spread(50.0), 2: _spread(12.0), 3: _spread(40.0)}
    bs = best_set(samples)
    assert bs["splits"] == [2]
    medians = {k: statistics.median(v) for k, v in samples.items()}
    splits = [{"split": k, "e2e_ms_median": v} for k, v in medians.items()]
    view = evaluate_run(["predicted-argmin", "measured"], ctx, splits, best_set=bs["splits"])
    assert view["predicted-argmin"]["chosen"] == 0
    assert view["predicted-argmin"]["tie"] is False
    assert view["predicted-argmin"]["regret"] == pytest.approx(30.0 / 12.0)
    assert view["measured"]["tie"] is True and view["measured"]["regret"] == 1.0
    # without a best set (an old summary) the keys are absent, not false
    assert "tie" not in evaluate_run(["measured"], ctx, splits)["measured"]


def test_pair_noise_is_the_split_half_regret_over_the_pairs_above_the_floor():
    from app_api.results.noise import pair_noise

    rows = []
    for i in range(8):  # (0, jpeg) and (3, int4) alternate as the faster; raw is slow
        rows += [{"split": 0, "transport": "jpeg-q50", "e2e_ms": 20.0 + (i % 2) * 4},
                 {"split": 3, "transport": "int4", "e2e_ms": 22.0},
                 {"split": 3, "transport": "raw", "e2e_ms": 60.0},
                 {"split": 5, "transport": "int4", "e2e_ms": 10.0}]
    pairs = [{"split": 0, "transport": "jpeg-q50", "top1_agreement": 1.0},
             {"split": 3, "transport": "int4", "top1_agreement": 0.995},
             {"split": 3, "transport": "raw", "top1_agreement": 1.0},
             {"split": 5, "transport": "int4", "top1_agreement": 0.5}]  # below the floor
    noise = pair_noise(rows, pairs, 0.99)
    # one half's best is jpeg at 20 ms, the other's int4 at 22 (jpeg there: 24)
    assert noise["pairs"] == 3 and noise["floor"] == 0.99
    assert noise["regret"] == pytest.approx((22.0 / 20.0 + 24.0 / 22.0) / 2)
    assert pair_noise(rows, pairs[3:], 0.99) is None


def test_the_split_only_choices_are_known_before_the_sweep():
    ctx = _ctx().to_dict()
    # predicted-argmin chooses 0 (see test_evaluate_regret_and_spearman); the oracle needs
    # the sweep's medians and split-codec the fidelity probe: neither can choose yet
    got = split_choices(["predicted-argmin", "measured", "split-codec"], ctx)
    assert got == [0]
    both = split_choices(["predicted-argmin", {"name": "neurosurgeon", "label": "n4",
                                               "params": {"criterion": "ineq4"}}], ctx)
    assert 0 in both and all(k in (0, 1, 2, 3) for k in both)
