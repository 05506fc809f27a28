"""Partitioners against a real measured sweep: two processes, a real socket, real AlexNet.

A cloud process (its own interpreter) serves AlexNet suffixes over an
authenticated data channel; this process is the edge. The link is probed,
both sides profile every layer, every valid split is measured end to end, and
``evaluate_run`` scores the partitioners against those medians. Timings are
not asserted (that is ``tracr bench``'s job); the pipeline and its invariants are.
"""

from __future__ import annotations

import json
import os
import secrets
import statistics
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")

CLOUD = r"""
import json, statistics, sys
import torch
torch.set_num_threads(1)
from experiment_design.split import build_split_model
from experiment_design.transport import CodecConfig, DataServer
from experiment_design.transport.errors import TransportError

secret = bytes.fromhex(sys.stdin.readline().strip())
sm = build_split_model("alexnet")
server = DataServer("127.0.0.1", 0, secret, CodecConfig(codec="none", filter="none"))
print("CLOUD-READY " + json.dumps({"port": server.address[1]}), flush=True)
ch = server.accept(timeout=120)
x = torch.zeros(1, 3, 224, 224)
with torch.inference_mode():
    while True:
        try:
            header, tensors, _ = ch.recv()
        except TransportError:
            break
        if header["op"] == "profile":
            sm.run_full(x, timed=True)
            runs = [dict(sm.run_full(x, timed=True)[1]) for _ in range(header["repeats"])]
            ms = [statistics.median(r[i] for r in runs) for i in range(1, len(sm.layers) + 1)]
            ch.send({"op": "profile", "layer_ms": ms})
        elif header["op"] == "infer":
            sm.run_suffix(header["split"], tensors)
            ch.send({"op": "done"})
server.close()
"""


@pytest.fixture
def cloud():
    secret = secrets.token_bytes(32)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [sys.executable, "-c", CLOUD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        proc.stdin.write(secret.hex() + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line.startswith("CLOUD-READY "), line
        yield secret, json.loads(line.split(" ", 1)[1])["port"]
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_partitioners_scored_against_a_real_alexnet_sweep(cloud, tmp_path):
    from app_api.results.scoring import evaluate_run
    from experiment_design.partitioners import PartitionContext
    from experiment_design.split import build_split_model
    from experiment_design.transport import CodecConfig, connect

    torch.set_num_threads(1)
    secret, port = cloud
    sm = build_split_model("alexnet")
    ch = connect("127.0.0.1", port, secret, CodecConfig(codec="none", filter="none"), timeout=60)
    x = torch.randn(1, 3, 224, 224)
    with ch, torch.inference_mode():
        network = ch.probe(rounds=3)
        sm.run_full(x, timed=True)  # warm-up, not recorded
        runs = [dict(sm.run_full(x, timed=True)[1]) for _ in range(3)]
        edge_ms = [statistics.median(r[i] for r in runs) for i in range(1, len(sm.layers) + 1)]
        ch.send({"op": "profile", "repeats": 3})
        header, _, _ = ch.recv()
        cloud_ms = header["layer_ms"]

        valid = sm.valid_splits()
        for k in (valid[0], valid[-1]):  # warm the suffix/prefix code paths, not recorded
            crossing, _ = sm.run_prefix(k, x)
            ch.send({"op": "infer", "split": k}, crossing)
            ch.recv()
        e2e: dict[int, list[float]] = {k: [] for k in valid}
        for _ in range(2):
            for k in valid:
                t0 = time.perf_counter()
                crossing, _ = sm.run_prefix(k, x)
                ch.send({"op": "infer", "split": k}, crossing)
                assert ch.recv()[0]["op"] == "done"
                e2e[k].append((time.perf_counter() - t0) * 1e3)

    ctx = PartitionContext(
        layers=sm.profile(),
        points=[
            {
                "index": p.index,
                "layer": p.layer,
                "crossing_bytes": p.crossing_bytes,
                "valid": p.valid,
            }
            for p in sm.points
        ],
        valid_splits=valid,
        edge_profile={"layer_ms": edge_ms},
        cloud_profile={"layer_ms": cloud_ms},
        network={"bandwidth_Bps": network["bandwidth_Bps"], "rtt_ms": network["rtt_ms"]},
    )
    splits = [{"split": k, "e2e_ms_median": statistics.median(v)} for k, v in e2e.items()]
    view = evaluate_run(
        [
            "neurosurgeon",
            "predicted-argmin",
            "measured",
            {
                "name": "neurosurgeon",
                "label": "neurosurgeon-ineq4",
                "params": {"criterion": "ineq4"},
            },
        ],
        ctx.to_dict(),
        splits,
        tmp_path,
    )

    assert network["bandwidth_Bps"] > 0 and len(cloud_ms) == len(sm.layers)
    best = min(splits, key=lambda r: r["e2e_ms_median"])
    for label, row in view.items():
        assert "error" not in row, (label, row)
        assert row["chosen"] in valid
        assert row["best"] == best["split"]
        assert row["regret"] >= 1.0
    assert view["measured"]["regret"] == 1.0
    assert view["neurosurgeon-ineq4"]["criterion"] == "ineq4"
    assert view["predicted-argmin"]["spearman"] is not None
    doc = json.loads((tmp_path / "partitioners.json").read_text())
    assert doc["inputs"]["edge_profile"]["layer_ms"] == edge_ms
    assert set(doc["evaluation"]) == set(view)
    print(json.dumps(view, indent=1))


def _run_on_localhost(tmp_path, overrides: list[str]):
    """neurosurgeon-alexnet with both participants on this machine, plus ``overrides``;
    the run must succeed."""
    from app_api.manifest import load_manifest
    from app_api.runner import run_experiment

    local = ["participant_instances.edge-1.device=localhost",
             "participant_instances.cloud-1.device=localhost"]
    result = run_experiment(load_manifest("neurosurgeon-alexnet", local + overrides),
                            out_dir=tmp_path / "run", progress=False)
    assert result.ok, result.errors
    return result


@pytest.mark.slow
def test_live_neurosurgeon_in_a_real_localhost_run(tmp_path):
    """The runner profiles both participants and probes the link; the edge decides once."""
    name = "neurosurgeon"
    result = _run_on_localhost(tmp_path, [
        f"partitioner.name={name}",
        "partitioner.params={}",
        "dataset.params.limit=2",
        "run.warmup=1",
    ])
    dec = result.summary["partitioner"]["edge-1"]["decision"]
    assert dec["name"] == name
    assert str(dec["chosen"]) in {str(k) for k in dec["predicted"]}  # JSON keys are strings
    assert dec["inputs"]["edge_profile"]["layers_timed"] == 22
    assert dec["inputs"]["cloud_profile"]["layers_timed"] == 22
    assert dec["inputs"]["network"]["bandwidth_Bps"] > 0
    # every inference ran at the one split the partitioner chose
    splits = [row["split"] for row in result.summary["splits"]]
    assert splits == [dec["chosen"]]
    assert dec["criterion"] == "ineq3" and dec["scan"]


@pytest.mark.slow
def test_runner_scores_partitioners_after_a_cyclic_sweep(tmp_path):
    """`evaluate.partitioners` in a manifest: summary.json "partitioners" + partitioners.json."""
    result = _run_on_localhost(tmp_path, [
        "partitioner.params.repeats=1",
        "~partitioner.params.race",
        "dataset.params.limit=1",
        "run.warmup=1",
    ])
    if "partitioners" not in result.summary:
        pytest.skip("the runner does not call app_api.results.scoring.evaluate_run yet")
    view = result.summary["partitioners"]
    assert set(view) == {"neurosurgeon", "predicted-argmin", "measured"}
    best = min(result.summary["splits"], key=lambda r: r["e2e_ms_median"])["split"]
    assert view["measured"]["chosen"] == best and view["measured"]["regret"] == 1.0
    for row in view.values():
        assert row["best"] == best and row["regret"] >= 1.0
    # one repeat per split: no split-half estimate of the measurement noise
    assert result.summary["measurement_noise"] is None
    doc = json.loads((result.run_dir / "partitioners.json").read_text())
    assert doc["inputs"]["network"]["bandwidth_Bps"] > 0


def test_a_raced_cyclic_sweep_stops_on_its_own_in_a_real_localhost_run(tmp_path):
    """`race`: the edge's task stops when the partitioner says the race is over; the
    decision in summary.json is the final one and counts every row."""
    from app_api.results import read_csv

    result = _run_on_localhost(tmp_path, [
        "partitioner.params.repeats=3",
        "partitioner.params.contenders=3",
        "+partitioner.params.splits=[0,8,22]",
        "partitioner.params.race={confidence: 0.9, budget: 12, min_samples: 3, precision: 0.01}",
        "dataset.params.limit=1",
        "run.warmup=1",
        "evaluate.partitioners=[]",
    ])
    dec = result.summary["partitioner"]["edge-1"]["decision"]
    race = dec["race"]
    assert dec["order"] == "interleaved" and dec["sweep_length"] == 3 * 3 + 12
    assert race["stopped"] in ("separated", "budget"), race
    assert race["stopped"] == "budget" or len(race["contenders"]) == 1
    assert 0 < race["inferences"] <= 12 and set(race["contenders"]) <= {0, 8, 22}
    # the winner's median: how well it is known, and whether the precision was reached
    assert race["precision"] == 0.01 and race["best_halfwidth_pct"] > 0
    assert race["precise"] == (race["best_halfwidth_pct"] <= 1.0)
    rows = read_csv(result.run_dir / "inferences.csv")
    assert len(rows) == dec["inferences"] == 3 * 3 + race["inferences"]
    assert [int(r["split"]) for r in rows[:9]] == [0, 8, 22] * 3  # the walk, round-robin
    print(json.dumps(race))


@pytest.mark.slow
def test_a_race_measures_the_scored_partitioners_choices_too(tmp_path):
    """The splits predicted-argmin and neurosurgeon choose from the start-up measurements
    are raced beside the walk's fastest split, so each is scored on a raced median."""
    from app_api.results import read_csv

    result = _run_on_localhost(tmp_path, [
        "partitioner.params.repeats=2",
        "partitioner.params.contenders=1",
        "partitioner.params.race={confidence: 0.95, budget: 12, min_samples: 3}",
        "dataset.params.limit=1",
        "run.warmup=1",
    ])
    s = result.summary
    race = s["partitioner"]["edge-1"]["decision"]["race"]
    chosen = {p["chosen"] for name, p in s["partitioners"].items() if name != "measured"}
    assert set(race["scored_choices"]) == chosen, (race, s["partitioners"])
    rows = read_csv(result.run_dir / "inferences.csv")
    walk = 2 * len(s["splits"])
    raced = {int(r["split"]) for r in rows[walk:]}
    if race["rounds"]:
        assert chosen <= raced  # each choice was raced, whatever the walk made of it
    else:  # the walk's fastest split was every partitioner's choice: nothing to race
        assert chosen == set(race["contenders"])
