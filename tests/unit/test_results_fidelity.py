"""The rate-fidelity summary on hand-made rows: per-pair figures, the Pareto pairs, and the
fastest pair above the fidelity floor against the compressed-input baseline."""

from __future__ import annotations

import pytest

from app_api.results.fidelity import (
    answer,
    codec_summary,
    pair_stats,
    predicted_ms,
    run_rates,
)


def row(split, transport, nbytes, agree=1, cosine=1.0, diff=0.0, ms=10.0, **kw):
    """One inference: ``ms`` of edge + cloud compute, 1 ms encode and 1 ms decode."""
    return {"split": split, "layer": f"l{split}", "transport": transport,
            "bytes_raw": 1000, "bytes_encoded": nbytes, "edge_ms": ms / 2, "cloud_ms": ms / 2,
            "encode_ms": 1.0, "decode_ms": 1.0, "e2e_ms": ms + 3.0, "top1_agree": agree,
            "cosine": cosine, "max_abs_diff": diff, "correct": "", **kw}


ROWS = [
    # lossless at split 0 and split 5: exact, many bytes
    row(0, "zstd-1", 600_000), row(0, "zstd-1", 600_000),
    row(5, "zstd-1", 150_000), row(5, "zstd-1", 150_000),
    # int8 at split 5: a quarter of the bytes, still agreeing
    row(5, "int8+zstd-1", 40_000, cosine=0.999, diff=0.02),
    row(5, "int8+zstd-1", 40_000, cosine=0.998, diff=0.03),
    # int4: fewer bytes, one of two inferences disagrees
    row(5, "int4+zstd-1", 20_000, agree=0, cosine=0.95, diff=0.4),
    row(5, "int4+zstd-1", 20_000, agree=1, cosine=0.97, diff=0.3),
    # the compressed input: JPEG at split 0
    row(0, "jpeg-q90", 60_000, cosine=0.99, diff=0.1),
    row(0, "jpeg-q90", 60_000, cosine=0.99, diff=0.1),
    row(0, "jpeg-q50", 30_000, agree=0, cosine=0.9, diff=0.5),
    row(0, "jpeg-q50", 30_000, error="cloud-1: boom"),
]


def by_pair(pairs):
    return {(p["split"], p["transport"]): p for p in pairs}


def test_pair_figures_failed_rows_counted_never_averaged():
    pairs = by_pair(pair_stats(ROWS))
    assert list(pairs) == sorted(pairs)
    int4 = pairs[(5, "int4+zstd-1")]
    assert (int4["count"], int4["top1_agreement"], int4["cosine_min"], int4["cosine_median"],
            int4["max_abs_diff_max"]) == (2, 0.5, 0.95, pytest.approx(0.96), 0.4)
    assert int4["bytes_encoded"] == 20_000 and int4["encode_ms_median"] == 1.0
    assert int4["accuracy"] is None and not int4["input_baseline"]
    q50 = pairs[(0, "jpeg-q50")]
    assert (q50["count"], q50["failed"], q50["top1_agreement"]) == (1, 1, 0.0)
    assert q50["input_baseline"] and pairs[(0, "jpeg-q90")]["input_baseline"]
    assert not pairs[(0, "zstd-1")]["input_baseline"]


def test_pareto_pairs_trade_bytes_for_cosine():
    pairs = by_pair(pair_stats(ROWS))
    front = {k for k, p in pairs.items() if p["pareto"]}
    # zstd at 5 is exact with fewer bytes than zstd at 0; int8, int4 and jpeg-q90 each
    # buy fewer bytes with some cosine; jpeg-q50 is beaten by int4 (fewer bytes, better)
    assert front == {(5, "zstd-1"), (5, "int8+zstd-1"), (5, "int4+zstd-1")}


def test_fastest_above_the_floor_against_the_compressed_input():
    pairs = pair_stats(ROWS)
    assert predicted_ms(by_pair(pairs)[(5, "int8+zstd-1")], 4e6) == pytest.approx(12 + 10)
    # at 4 MB/s: int8 at 5 (12 + 10 ms) beats jpeg-q90 (12 + 15 ms); int4 is below the floor
    a = answer(pairs, 4e6, 0.99, "4MB/s")
    assert (a["fastest"]["split"], a["fastest"]["transport"]) == (5, "int8+zstd-1")
    assert a["baseline"]["transport"] == "jpeg-q90" and a["baseline"]["ms"] == pytest.approx(27)
    assert a["beats_baseline"] is True and a["speedup"] == pytest.approx(27 / 22)
    # a floor of 0.5 admits int4 (12 + 5 ms)
    assert answer(pairs, 4e6, 0.5)["fastest"]["transport"] == "int4+zstd-1"
    # on a fast enough link the fewest bytes still break the tie of equal compute
    fast = answer(pairs, 1e9, 0.99)
    assert fast["fastest"]["transport"] == "int8+zstd-1" and fast["beats_baseline"] is True
    # no pair meets an impossible floor
    none = answer(pairs, 4e6, 1.5)
    assert none["fastest"] is None and none["beats_baseline"] is None


def test_the_compressed_input_can_win():
    rows = [row(5, "zstd-1", 400_000), row(0, "jpeg-q90", 20_000, cosine=0.995)]
    a = answer(pair_stats(rows), 1e6, 0.99)
    assert a["fastest"]["transport"] == "jpeg-q90" and a["beats_baseline"] is False
    # no compressed input at all: nothing to compare with
    a = answer(pair_stats(rows[:1]), 1e6)
    assert a["baseline"] is None and a["baselines_measured"] == 0


def test_rates_given_then_the_lab_link_else_the_probed_one():
    probed = {"network": {"edge-1": {"bandwidth_Bps": 2e9, "rtt_ms": 0.1}}}
    assert run_rates(probed, ["4MB/s"]) == [("4MB/s", 4e6), ("probed edge-1 link", 2e9)]
    lab = {"network": {"edge-1": {"bandwidth_Bps": 2e9},
                       "lab": {"configured": {"bandwidth": "4MB/s"}, "bandwidth_Bps": 3.9e6}}}
    assert run_rates(lab) == [("lab link (4MB/s)", 3.9e6)]
    assert run_rates({}) == []


def test_codec_summary_only_for_a_transport_sweep():
    one = [row(5, "zstd-1", 1000)]
    assert codec_summary(one, {}, {}) is None
    s = codec_summary(one, {"weights": "random"}, {"transports": [{"codec": "zstd"}],
                                                  "fidelity_floor": 0.9,
                                                  "bandwidths": ["1MB/s"]})
    assert s["floor"] == 0.9 and [a["bandwidth"] for a in s["answers"]] == ["1MB/s"]
    assert "random weights" in s["note"]
    real = codec_summary(ROWS, {"weights": "pretrained"}, {})
    assert "note" not in real and len(real["pairs"]) == 6
    # rows read back from inferences.csv are text
    text = [{k: str(v) for k, v in r.items()} for r in ROWS if not r.get("error")]
    assert by_pair(pair_stats(text)) == by_pair(pair_stats([r for r in ROWS
                                                            if not r.get("error")]))
