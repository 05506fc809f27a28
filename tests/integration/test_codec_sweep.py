"""A transport sweep on the localhost device: every (split, transport) pair measured, each
inference's output compared with the unsplit model's, the rate-fidelity summary and plot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

SPLITS = [0, 3, 8]
TRANSPORTS = ("[{codec: zstd, level: 1}, {codec: none, level: 0, filter: none}, "
              "{codec: lz4, level: 5}]")


@pytest.mark.slow
def test_lossless_transport_sweep_is_exact_and_summarized(tmp_path):
    from app_api.manifest import load_manifest
    from app_api.results import read_csv
    from app_api.runner import run_experiment

    overrides = ["partitioner.params.repeats=2", "dataset.params.limit=2", "run.warmup=1",
                 f"+partitioner.params.splits={SPLITS}",
                 f"+partitioner.params.transports={TRANSPORTS}",
                 "+partitioner.params.bandwidths=[4MB/s]"]
    result = run_experiment(load_manifest("alexnet-sweep", overrides),
                            out_dir=tmp_path / "run", progress=False)
    assert result.ok, result.errors
    s = result.summary
    decision = s["partitioner"]["edge-1"]["decision"]
    labels = decision["transports"]
    assert len(labels) == 3 and decision["pairs"] == 9
    rows = read_csv(result.run_dir / "inferences.csv")
    assert len(rows) == s["inferences"] == decision["sweep_length"] == 9 * 2
    # the pairs split-major, visited round-robin (cyclic's default order), `repeats` rounds
    assert [(int(r["split"]), r["transport"]) for r in rows] == [
        (k, t) for k in SPLITS for t in labels] * 2
    for r in rows:
        # lossless: the split output is the unsplit output, bit for bit
        assert (r["top1_agree"], float(r["cosine"]), float(r["max_abs_diff"])) == ("1", 1.0, 0.0)
        assert r["correct"] == ""  # random weights: no accuracy
        assert int(r["bytes_encoded"]) > 0 and float(r["encode_ms"]) >= 0
    raw = [r for r in rows if r["transport"] == labels[1]]  # codec none
    assert raw and all(r["bytes_encoded"] == r["bytes_raw"] for r in raw)

    codecs = s["codecs"]
    assert [(p["split"], p["transport"]) for p in codecs["pairs"]] == sorted(
        (k, t) for k in SPLITS for t in labels)
    for p in codecs["pairs"]:
        assert p["count"] == 2 and p["failed"] == 0
        assert (p["top1_agreement"], p["cosine_min"], p["cosine_median"],
                p["max_abs_diff_max"]) == (1.0, 1.0, 1.0, 0.0)
        assert p["accuracy"] is None and not p["input_baseline"]
        assert p["bytes_encoded"] <= p["bytes_raw"]
    # all equally faithful: the front is the pair(s) sending the fewest bytes
    fewest = min(p["bytes_encoded"] for p in codecs["pairs"])
    assert {p["bytes_encoded"] for p in codecs["pairs"] if p["pareto"]} == {fewest}
    assert codecs["floor"] == 0.99 and "random weights" in codecs["note"]
    rates = [a["bandwidth"] for a in codecs["answers"]]
    assert rates[0] == "4MB/s" and rates[1].startswith("probed")
    for a in codecs["answers"]:
        assert a["fastest"] is not None and a["baseline"] is None
        assert a["beats_baseline"] is None
    assert (result.run_dir / "plots" / "rate-fidelity.png").stat().st_size > 0

    out = subprocess.run([sys.executable, "app.py", "results", "show", str(result.run_dir)],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "per (split, transport)" in out.stdout and "at 4MB/s" in out.stdout
    assert "no compressed-input pair was measured" in out.stdout
    assert "random weights" in out.stdout


@pytest.mark.slow
def test_split_codec_is_scored_against_the_measured_pairs(tmp_path):
    from app_api.manifest import load_manifest
    from app_api.runner import run_experiment

    transports = ("[{codec: zstd, level: 1}, {lossy: int8, codec: zstd, level: 1}, "
                  "{lossy: int4, codec: zstd, level: 1}]")
    overrides = ["partitioner.params.repeats=2", "dataset.params.limit=2", "run.warmup=1",
                 f"+partitioner.params.splits={SPLITS}",
                 f"partitioner.params.transports={transports}",
                 "partitioner.params.bandwidths=[4MB/s]"]
    result = run_experiment(load_manifest("codec-sweep", overrides),
                            out_dir=tmp_path / "run", progress=False)
    assert result.ok, result.errors
    s = result.summary
    # the head probed every swept pair at start-up, before the sweep
    probe = s["partitioner"]["edge-1"]["fidelity"]
    assert probe["items"] == 2 and probe["splits"] == SPLITS
    assert {(p["split"], p["transport"]) for p in probe["pairs"]} == {
        (p["split"], p["transport"]) for p in s["codecs"]["pairs"]}
    sc = s["partitioners"]["split-codec"]
    assert "error" not in sc, sc
    assert (sc["chosen"], sc["transport"]) in {
        (p["split"], p["transport"]) for p in s["codecs"]["pairs"]}
    assert sc["floor"] == {"metric": "top1_agree", "min": 0.99}
    assert sc["regret"] is not None and sc["regret"] > 0
    assert isinstance(sc["meets_floor_measured"], bool)
    assert s["partitioners"]["predicted-argmin"]["chosen"] in SPLITS
    # the per-split oracle is the run's own transport's (zstd-1 with shuffle), not a
    # median pooled over every transport at a split
    assert s["split_transport"]["label"] == s["split_transport"]["run_transport"] == "zstd-1"
    zstd = {p["split"]: p for p in s["codecs"]["pairs"] if p["transport"] == "zstd-1"}
    assert {r["split"]: r["e2e_ms_median"] for r in s["splits"]} == {
        k: p["e2e_ms_median"] for k, p in zstd.items()}
    assert all(r["count"] == 2 for r in s["splits"])
    pa = s["partitioners"]["predicted-argmin"]
    assert pa["scored_on"] == "zstd-1"
    assert pa["best_ms"] == min(p["e2e_ms_median"] for p in zstd.values())
    noise = s["measurement_noise"]
    assert noise["repeats_max"] == 2 and noise["pairs"]["floor"] == 0.99
    assert noise["pairs"]["pairs"] == sum(1 for p in s["codecs"]["pairs"]
                                          if p["top1_agreement"] >= 0.99)
    full = json.loads((result.run_dir / "partitioners.json").read_text())
    dec = full["evaluation"]["split-codec"]["decision"]
    assert dec["probe"]["pairs"] == 9 and len(dec["pairs"]) == 9
    assert full["inputs"]["fidelity"]["pairs"] == probe["pairs"]

    out = subprocess.run([sys.executable, "app.py", "results", "show", str(result.run_dir)],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "split-codec" in out.stdout and "the floor top1_agree >= 0.99" in out.stdout
    assert "per split: the zstd-1 rows alone (6 of 18 inferences" in out.stdout
