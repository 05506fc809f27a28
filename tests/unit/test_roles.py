"""Edge and cloud roles in one process (no subprocesses): rows, layers, exact outputs."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
from torch import nn

from experiment_design.models import register_model
from experiment_design.protocol import INFER_COLUMNS, LAYER_COLUMNS

MODEL = "runtime-test-tiny"


@register_model(MODEL, input_shape=(3, 16, 16), description="tiny conv net for runtime tests")
def _tiny() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(4 * 8 * 8, 10),
    )


def config(instance: str, secret: str, **extra) -> str:
    cfg = {
        "instance": instance,
        "model": {"name": MODEL, "weights": None, "depth": None, "mode": "auto", "batch": 1},
        "seed": 0,
        "dataset": {"name": "synthetic", "params": {"size": 3}},
        "transport": {"codec": "zstd", "level": 1, "filter": "shuffle"},
        "partitioner": {"name": "cyclic", "params": {"repeats": 2}},
        "data_secret": secret,
        "threads": 1,
    }
    cfg.update(extra)
    return json.dumps(cfg)


def wait_state(role, timeout=30.0) -> dict:
    deadline = time.monotonic() + timeout
    acc = {"records": [], "layers": []}
    while time.monotonic() < deadline:
        st = json.loads(role.exposed_poll(json.dumps({"wait_s": 0.2})))
        acc["records"] += st["records"]
        acc["layers"] += st["layers"]
        if st["state"] in ("done", "failed"):
            st.update(acc)
            return st
    raise AssertionError("task did not finish")


@pytest.fixture
def pair():
    from experiment_design.roles import get_role

    torch.set_num_threads(1)
    secret = os.urandom(32).hex()
    edge = get_role("edge")(instance="edge-1")
    cloud = get_role("cloud")(instance="cloud-1")
    cinfo = json.loads(cloud.exposed_setup(config("cloud-1", secret)))
    einfo = json.loads(edge.exposed_setup(config("edge-1", secret)))
    addr = json.loads(cloud.exposed_data_address())
    edge.exposed_connect_partners(
        json.dumps(
            {"downstream": [{"instance": "cloud-1", "host": addr["host"], "port": addr["port"]}]}
        )
    )
    yield edge, cloud, einfo, cinfo
    edge.close()
    cloud.close()


def test_sweep_rows_layers_and_exact_outputs(pair):
    edge, cloud, einfo, cinfo = pair
    assert einfo["valid_splits"] == cinfo["valid_splits"]
    valid = einfo["valid_splits"]
    edge.exposed_warmup(1)
    prep = json.loads(edge.exposed_prepare_partitioner("{}"))
    assert prep["sweep_length"] == 2 * len(valid)
    edge.exposed_start_task(json.dumps({"task": "infer-dataset", "params": {}}))
    cloud.exposed_start_task(json.dumps({"task": "wait"}))
    st = wait_state(edge)
    assert st["state"] == "done", st["error"]
    rows = st["records"]
    assert len(rows) == 2 * len(valid)
    assert [r["split"] for r in rows] == valid * 2  # cyclic's default order: round-robin
    assert all(r["error"] == "" for r in rows)
    # the records carry only the protocol's columns (the observer adds instance and host)
    assert all(set(r) <= set(INFER_COLUMNS) - {"instance", "host"} for r in rows)
    assert all(set(lr) <= set(LAYER_COLUMNS) for lr in st["layers"])
    for r in rows:
        parts = r["edge_ms"] + r["encode_ms"] + r["transfer_ms"] + r["decode_ms"] + r["cloud_ms"]
        assert abs(parts - r["e2e_ms"]) < 1e-6 and r["e2e_ms"] > 0
        assert r["weights"] == "random" and r["n_crossing"] >= 1
    # every layer ran exactly once per inference, on one side or the other
    n = len(edge.split_model.layers)
    for r in rows:
        mine = [lr for lr in st["layers"] if lr["inference"] == r["inference"]]
        assert sorted(lr["index"] for lr in mine) == list(range(1, n + 1))
        assert all(lr["side"] == ("edge" if lr["index"] <= r["split"] else "cloud") for lr in mine)
    # the split outputs equal the unsplit model's
    ref = edge.split_model
    by_item = {item: x for x, _, item in edge.inputs}
    assert len(by_item) == len(edge.inputs) > 1
    # every split saw the same inputs: its n-th visit infers input n
    assert [r["item"] for r in rows] == [edge.inputs[j][2] for j in (0, 1) for _ in valid]
    for r in rows:
        x = by_item[r["item"]]
        out, _ = ref.run_full(x)
        assert r["top1"] == int(out[0].argmax())
        assert abs(r["output_sum"] - float(out.double().sum())) < 1e-3
    edge.exposed_start_task(json.dumps({"task": "finish"}))
    assert wait_state(edge)["state"] == "done"
    st = wait_state(cloud, timeout=10)
    assert st["state"] == "done"


def test_the_next_task_starts_at_once_after_a_poll_saw_the_last_one_done(pair, monkeypatch):
    """A task's state is published before its thread has ended: a poll that reads "done"
    and starts the next task at once met a thread still alive (under load, two sweeps of
    one ``make test`` failed with "task 'infer-dataset' is still running"). The next task
    waits for a finished task's thread to end; one still running is still refused."""
    from experiment_design.errors import TracrError

    edge, cloud, einfo, _ = pair
    edge.exposed_prepare_partitioner("{}")
    run = edge._run_task

    def slow_to_end(task):
        run(task)
        time.sleep(0.5)  # the thread's own exit, after its state is out

    monkeypatch.setattr(edge, "_run_task", slow_to_end)
    k = einfo["valid_splits"][-1]
    edge.exposed_start_task(json.dumps({"task": "infer-one", "params": {"index": 1, "split": k}}))
    assert wait_state(edge)["state"] == "done"
    edge.exposed_start_task(json.dumps({"task": "finish"}))  # the code before: refused
    assert wait_state(edge)["state"] == "done"
    cloud.exposed_start_task(json.dumps({"task": "wait", "params": {"timeout_s": 30}}))
    with pytest.raises(TracrError, match="still running"):
        cloud.exposed_start_task(json.dumps({"task": "finish"}))


def test_infer_one_and_profile(pair):
    edge, cloud, einfo, _ = pair
    edge.exposed_prepare_partitioner("{}")
    k = einfo["valid_splits"][-1]
    edge.exposed_start_task(json.dumps({"task": "infer-one", "params": {"index": 1, "split": k}}))
    st = wait_state(edge)
    assert st["state"] == "done" and len(st["records"]) == 1
    assert st["records"][0]["split"] == k
    prof = json.loads(cloud.exposed_profile_layers(json.dumps({"repeats": 2, "warmup": 0})))
    assert len(prof["layers"]) == len(cloud.split_model.layers) and prof["total_ms"] > 0
    link = json.loads(edge.exposed_probe_link("{}"))
    assert link["bandwidth_Bps"] > 0 and link["rtt_ms"] > 0


def test_lost_cloud_gives_an_error_row_and_a_failed_task(pair):
    edge, cloud, _, _ = pair
    edge.exposed_prepare_partitioner("{}")
    cloud.close()  # the cloud goes away: its data channels close
    edge.exposed_start_task(json.dumps({"task": "infer-dataset", "params": {"count": 3}}))
    st = wait_state(edge)
    assert st["state"] == "failed" and "link to cloud-1 failed" in st["error"]
    assert len(st["records"]) == 1  # one error row, not zeros, and no more attempts
    row = st["records"][0]
    assert "link to cloud-1 failed" in row["error"] and "e2e_ms" not in row


def test_participants_wired_with_link_keys_alone():
    """The observer's way: no run secret on the participants; the cloud admits the edge
    by name, address and link key, the edge connects with that key, and the cloud's data
    server stops listening once it has."""
    from experiment_design.roles import get_role
    from experiment_design.transport import link_key

    key = link_key(os.urandom(32), "cloud-1", "edge-1").hex()
    edge = get_role("edge")(instance="edge-1")
    cloud = get_role("cloud")(instance="cloud-1")
    try:
        cloud.exposed_setup(config("cloud-1", ""))
        edge.exposed_setup(config("edge-1", ""))
        addr = json.loads(cloud.exposed_data_address())
        admitted = cloud.exposed_admit_partners(json.dumps(
            {"partners": [{"instance": "edge-1", "hosts": ["127.0.0.1"], "key": key}]}))
        assert json.loads(admitted) == {"admitted": ["edge-1"]}
        edge.exposed_connect_partners(json.dumps({"downstream": [
            {"instance": "cloud-1", "host": addr["host"], "port": addr["port"], "key": key}]}))
        deadline = time.monotonic() + 5
        while not cloud.server.complete and time.monotonic() < deadline:
            time.sleep(0.02)
        assert cloud.server.complete  # the port is closed for the rest of the run
        assert [name for name, _ in edge.channels] == ["cloud-1"]
    finally:
        edge.close()
        cloud.close()
