"""split-codec: the (split, transport) choice under a fidelity floor, the head's start-up
fidelity probe, and its scoring against a measured (split, transport) sweep."""

from __future__ import annotations

import pytest

from experiment_design.errors import TracrError
from experiment_design.partitioners import PartitionContext, create_partitioner

ZSTD = {"codec": "zstd", "level": 1}
INT8 = {"lossy": "int8", "codec": "zstd", "level": 1}
INT4 = {"lossy": "int4", "codec": "zstd", "level": 1}
TRANSPORTS = [ZSTD, INT8, INT4]


def _probe_row(k, label, nbytes, enc, agree, cosine=1.0, dec=0.1):
    return {"split": k, "transport": label, "top1_agree": agree, "cosine_min": cosine,
            "bytes": nbytes, "encode_ms": enc, "decode_ms": dec}


def _ctx(rows, bandwidth_Bps=1e6, rtt_ms=1.0):
    """Three layers of 2 ms on each side: every split costs 6 ms of compute; the pairs
    differ only in encode/decode time and bytes."""
    layers = [{"index": i, "name": f"l{i}", "type": "Conv2d"} for i in (1, 2, 3)]
    points = [{"index": k, "crossing_bytes": 1000, "valid": True} for k in range(4)]
    prof = {"layer_ms": [2.0, 2.0, 2.0]}
    return PartitionContext(layers=layers, points=points, valid_splits=[0, 1, 2, 3],
                            edge_profile=prof, cloud_profile=dict(prof),
                            network={"bandwidth_Bps": bandwidth_Bps, "rtt_ms": rtt_ms},
                            fidelity={"items": 2, "seconds": 0.1, "pairs": rows})


ROWS = [
    _probe_row(1, "zstd-1", 1_000_000, 0.2, 1.0),
    _probe_row(1, "int8+zstd-1", 250_000, 1.0, 1.0, 0.9999),
    _probe_row(1, "int4+zstd-1", 125_000, 1.0, 0.5, 0.99),  # fewest bytes, below the floor
    _probe_row(2, "zstd-1", 2_000_000, 0.2, 1.0),
    _probe_row(2, "int8+zstd-1", 500_000, 1.0, 1.0, 0.9999),
]


def test_fastest_pair_above_the_floor_and_its_codec_is_sent():
    p = create_partitioner("split-codec", transports=TRANSPORTS)
    p.setup(_ctx(ROWS))
    d = p.decision()
    # int4 at split 1 would be faster at 1 MB/s but agrees on only half the inputs
    assert (d["chosen"], d["transport"]) == (1, "int8+zstd-1")
    assert p.next_split() == 1 and p.transport.label == "int8+zstd-1"
    assert d["fidelity"] == {"top1_agree": 1.0, "cosine_min": 0.9999, "meets_floor": True}
    assert d["chosen_ms"] == pytest.approx(2 + 1.0 + 250 + 1 + 0.1 + 4)
    assert (d["runner_up"]["split"], d["runner_up"]["transport"]) == (2, "int8+zstd-1")
    assert {(r["split"], r["transport"]) for r in d["pairs"] if not r["meets_floor"]} == {
        (1, "int4+zstd-1")}
    assert d["probe"]["pairs"] == 5 and not d["notes"]


def test_a_cosine_floor_reads_the_probed_cosine_minimum():
    p = create_partitioner("split-codec", transports=TRANSPORTS,
                           floor={"metric": "cosine", "min": 0.95})
    p.setup(_ctx(ROWS))
    assert (p.decision()["chosen"], p.decision()["transport"]) == (1, "int4+zstd-1")
    p = create_partitioner("split-codec", transports=TRANSPORTS,
                           floor={"metric": "cosine", "min": 0.99999})
    p.setup(_ctx(ROWS))
    assert p.decision()["transport"] == "zstd-1"


def test_no_pair_above_the_floor_falls_back_to_lossless():
    rows = [_probe_row(1, "zstd-1", 1_000_000, 0.2, 0.0, 0.5),
            _probe_row(1, "int4+zstd-1", 125_000, 1.0, 0.0, 0.5),
            _probe_row(2, "zstd-1", 900_000, 0.2, 0.0, 0.5)]
    p = create_partitioner("split-codec", transports=TRANSPORTS)
    p.setup(_ctx(rows))
    d = p.decision()
    assert (d["chosen"], d["transport"]) == (2, "zstd-1")
    assert d["fidelity"]["meets_floor"] is False
    assert "no probed pair meets top1_agree >= 0.99" in d["notes"][0]


def test_a_faster_link_compresses_less():
    rows = [_probe_row(1, "zstd-1", 1_000_000, 0.1, 1.0, dec=0.1),
            _probe_row(1, "int8+zstd-1", 250_000, 2.0, 1.0, 0.9999, dec=1.0)]
    slow = create_partitioner("split-codec", transports=TRANSPORTS)
    slow.setup(_ctx(rows, bandwidth_Bps=1e6))
    fast = create_partitioner("split-codec", transports=TRANSPORTS)
    fast.setup(_ctx(rows, bandwidth_Bps=1e10))
    assert slow.decision()["transport"] == "int8+zstd-1"
    assert fast.decision()["transport"] == "zstd-1"
    # the what-if link param overrides the probed one, as predicted-argmin's does
    what_if = create_partitioner("split-codec", transports=TRANSPORTS, bandwidth_Bps=1e10)
    what_if.setup(_ctx(rows, bandwidth_Bps=1e6))
    assert what_if.decision()["transport"] == "zstd-1"


JPEG50 = {"lossy": "jpeg", "quality": 50, "codec": "none", "level": 0, "filter": "none"}


def test_the_decode_is_charged_at_the_clouds_speed_not_the_paced_heads():
    # codec-sweep-lab with the edge paced at 0.25 core: the probe on the head timed
    # jpeg-q50's decode at 4.26 ms of wall time and int4's at 1.71, so split-codec chose
    # (0, int4+zstd-1) at 1.087 of the best; in the sweep the cloud decoded them in 1.24
    # and 1.03 ms and (0, jpeg-q50) was fastest. The work is the probe's CPU time; the
    # cloud does it at its own speed (cloud full_ms / edge full_cpu_ms).
    rows = [{**_probe_row(0, "jpeg-q50", 6085, 3.59, 1.0, 0.9998, dec=4.26),
             "decode_cpu_ms": 1.06},
            {**_probe_row(0, "int4+zstd-1", 16948, 2.53, 1.0, 0.9999, dec=1.71),
             "decode_cpu_ms": 0.43}]
    ctx = _ctx(rows, bandwidth_Bps=3.82e6, rtt_ms=0.0)
    ctx.edge_profile = {"layer_ms": [40.0, 40.0, 40.0], "full_ms": 123.9, "full_cpu_ms": 30.6}
    ctx.cloud_profile = {"layer_ms": [9.5, 9.5, 9.5], "full_ms": 28.3, "full_cpu_ms": 27.3}
    p = create_partitioner("split-codec", transports=[INT4, JPEG50])
    p.setup(ctx)
    d = p.decision()
    assert (d["chosen"], d["transport"]) == (0, "jpeg-q50")
    factor = 28.3 / 30.6
    assert d["decode"]["factor"] == pytest.approx(factor)
    by = {r["transport"]: r for r in d["pairs"]}
    assert by["jpeg-q50"]["decode_ms"] == pytest.approx(1.06 * factor)
    assert by["jpeg-q50"]["decode_probed_ms"] == 4.26
    # a probe from before the CPU time was recorded keeps the head's wall time
    old = [{k: v for k, v in r.items() if k != "decode_cpu_ms"} for r in rows]
    ctx.fidelity = {"items": 2, "seconds": 0.1, "pairs": old}
    p = create_partitioner("split-codec", transports=[INT4, JPEG50])
    p.setup(ctx)
    assert p.decision()["transport"] == "int4+zstd-1"
    assert {r["transport"]: r["decode_ms"] for r in p.decision()["pairs"]} == {
        "jpeg-q50": 4.26, "int4+zstd-1": 1.71}


def test_only_allowed_splits_and_named_transports_are_candidates():
    p = create_partitioner("split-codec", transports=[ZSTD], splits=[2])
    p.setup(_ctx(ROWS))
    assert {(r["split"], r["transport"]) for r in p.decision()["pairs"]} == {(2, "zstd-1")}


def test_bad_params_and_a_missing_probe_are_errors():
    with pytest.raises(TracrError, match="floor metric"):
        create_partitioner("split-codec", floor={"metric": "accuracy", "min": 0.9})
    with pytest.raises(TracrError, match="must be a mapping"):
        create_partitioner("split-codec", transports=["zstd"])
    p = create_partitioner("split-codec")
    with pytest.raises(TracrError, match="no fidelity probe"):
        p.setup(_ctx([]))
    with pytest.raises(TracrError, match="before setup"):
        p.next_split()


def test_default_transports_and_probe_request():
    p = create_partitioner("split-codec", probe_splits=4)
    req = p.probe_request()
    assert p.floor == {"metric": "top1_agree", "min": 0.99}
    assert req["items"] == 2 and req["max_splits"] == 4 and req["splits"] == "all"
    labels = [create_partitioner("cyclic", transports=req["transports"]).transports[i][2].label
              for i in range(len(req["transports"]))]
    assert labels == ["zstd-1", "fp16+zstd-1", "int8+zstd-1", "int8c+zstd-1", "int4+zstd-1",
                      "jpeg-q90", "jpeg-q50", "webp-q90", "webp-q50"]
    # the input codecs are probed at split 0 only
    assert [t.get("splits") for t in req["transports"][5:]] == [[0]] * 4


def test_spread_keeps_the_ends():
    from experiment_design.runtime.fidelity import spread

    assert spread(list(range(23)), 5) == [0, 6, 11, 16, 22]
    assert spread([0, 3, 8], 5) == [0, 3, 8]


def test_probe_on_alexnet_lossless_is_exact_and_int8_is_four_times_smaller():
    import torch

    from experiment_design.runtime.fidelity import probe, reference_outputs
    from experiment_design.split import build_split_model
    from experiment_design.transport import CodecConfig

    sm = build_split_model("alexnet", seed=0)
    gen = torch.Generator().manual_seed(0)
    inputs = [(torch.randn(1, 3, 224, 224, generator=gen), None, str(i)) for i in range(2)]
    refs = reference_outputs(sm, inputs)
    zstd, int8 = CodecConfig.from_dict(ZSTD), CodecConfig.from_dict(INT8)
    jpeg = CodecConfig(codec="none", level=0, filter="none", lossy="jpeg", quality=90)
    out = probe(sm, inputs, refs, [(0, zstd), (0, jpeg), (3, zstd), (3, int8)], items=2)
    assert out["items"] == 2 and out["seconds"] > 0
    rows = {(r["split"], r["transport"]): r for r in out["pairs"]}
    assert list(rows) == [(0, "zstd-1"), (0, "jpeg-q90"), (3, "zstd-1"), (3, "int8+zstd-1")]
    for key in ((0, "zstd-1"), (3, "zstd-1")):
        r = rows[key]
        assert (r["top1_agree"], r["cosine_min"], r["max_abs_diff"]) == (1.0, 1.0, 0.0)
        assert 0 < r["bytes"] <= r["bytes_raw"]
    q = rows[(3, "int8+zstd-1")]
    assert q["bytes_raw"] == sm.points[3].crossing_bytes
    assert q["bytes"] * 3.9 <= q["bytes_raw"] and q["cosine_min"] >= 0.99
    assert rows[(0, "jpeg-q90")]["bytes"] < rows[(0, "zstd-1")]["bytes"]
    assert all(r["encode_ms"] >= 0 and r["decode_ms"] >= 0 for r in out["pairs"])
    assert all(0 <= r["decode_cpu_ms"] for r in out["pairs"])


def _measured(k, label, e2e, agree, cosine=1.0):
    return {"split": k, "transport": label, "e2e_ms_median": e2e, "top1_agreement": agree,
            "cosine_min": cosine}


def test_scored_against_the_measured_pairs_under_the_same_floor():
    from app_api.results.scoring import evaluate_partitioners, summary_view

    pairs = [_measured(1, "zstd-1", 900.0, 1.0), _measured(1, "int8+zstd-1", 300.0, 1.0),
             _measured(1, "int4+zstd-1", 150.0, 0.5),  # fastest, below the floor
             _measured(2, "zstd-1", 1800.0, 1.0), _measured(2, "int8+zstd-1", 280.0, 1.0)]
    medians = {1: 450.0, 2: 1040.0}
    names = ["split-codec", "predicted-argmin"]
    ev = evaluate_partitioners(names, _ctx(ROWS), medians, pairs,
                               sweep={"transports": TRANSPORTS, "splits": [1, 2]})
    sc = ev["split-codec"]
    assert (sc["chosen"], sc["transport"], sc["chosen_ms"]) == (1, "int8+zstd-1", 300.0)
    assert (sc["best"], sc["best_transport"], sc["best_ms"]) == (2, "int8+zstd-1", 280.0)
    assert sc["regret"] == pytest.approx(300 / 280)
    assert sc["meets_floor_measured"] is True and sc["meets_floor_probed"] is True
    assert sc["spearman_n"] == 5
    # split-only scoring of the others is unchanged: the per-split medians
    assert (ev["predicted-argmin"]["best"], ev["predicted-argmin"]["best_ms"]) == (1, 450.0)
    view = summary_view(ev)
    assert view["split-codec"]["floor"] == {"metric": "top1_agree", "min": 0.99}
    assert "transport" not in view["predicted-argmin"]


def test_a_pair_the_samples_cannot_separate_from_the_best_is_a_tie():
    """The chosen pair (1, int8) at 300 ms against the best (2, int8) at 280 ms: a tie when
    their samples overlap, not when they are tight; the pair below the floor (int4, the
    fastest) is never the best it is compared with."""
    from app_api.results.noise import pair_samples
    from app_api.results.scoring import evaluate_partitioners

    pairs = [_measured(1, "zstd-1", 900.0, 1.0), _measured(1, "int8+zstd-1", 300.0, 1.0),
             _measured(1, "int4+zstd-1", 150.0, 0.5),
             _measured(2, "zstd-1", 1800.0, 1.0), _measured(2, "int8+zstd-1", 280.0, 1.0)]

    def rows(spread: float) -> list[dict]:
        out = []
        for p in pairs:
            for i in range(12):  # symmetric around the pair's median
                out.append({"split": p["split"], "transport": p["transport"],
                            "e2e_ms": p["e2e_ms_median"] + spread * (i - 5.5) / 5.5})
        out.append({"split": 1, "transport": "int8+zstd-1", "e2e_ms": None,
                    "error": "link to cloud-1 failed"})
        return out

    def score(spread: float) -> dict:
        return evaluate_partitioners(["split-codec"], _ctx(ROWS), {1: 1.0, 2: 1.0}, pairs,
                                     sweep={"transports": TRANSPORTS},
                                     pair_samples=pair_samples(rows(spread)))["split-codec"]

    wide, tight = score(60.0), score(2.0)
    assert wide["regret"] == tight["regret"] == pytest.approx(300 / 280)
    assert wide["tie"] is True and wide["in_best_set"] is True
    assert tight["tie"] is False and tight["in_best_set"] is False
    assert len(pair_samples(rows(1.0))[(1, "int8+zstd-1")]) == 12  # the failed row left out


def test_a_pair_below_the_floor_as_measured_is_reported():
    from app_api.results.scoring import evaluate_partitioners

    pairs = [_measured(1, "zstd-1", 900.0, 1.0), _measured(1, "int8+zstd-1", 300.0, 0.5),
             _measured(2, "zstd-1", 1800.0, 1.0), _measured(2, "int8+zstd-1", 280.0, 0.5)]
    ev = evaluate_partitioners(["split-codec"], _ctx(ROWS), {1: 1.0, 2: 1.0}, pairs,
                               sweep={"transports": TRANSPORTS})
    sc = ev["split-codec"]
    assert sc["transport"] == "int8+zstd-1" and sc["meets_floor_measured"] is False
    assert (sc["best"], sc["best_transport"]) == (1, "zstd-1")
    assert sc["regret"] == pytest.approx(300 / 900)


def test_fidelity_request_takes_the_sweeps_transports():
    from app_api.results.scored import fidelity_request

    assert fidelity_request(["predicted-argmin"], {"transports": TRANSPORTS}) is None
    req = fidelity_request(["predicted-argmin", {"name": "split-codec",
                                                 "params": {"probe_items": 3}}],
                           {"transports": TRANSPORTS, "splits": [0, 3]})
    assert req == {"transports": TRANSPORTS, "splits": [0, 3], "items": 3, "max_splits": None}
