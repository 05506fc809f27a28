"""Run directories: written, listed, found again, readable by pandas."""

from __future__ import annotations

import json

import pytest

from app_api.results import (
    INFER_COLUMNS,
    RunWriter,
    build_summary,
    find_run,
    list_runs,
    load_summary,
    new_run_id,
    read_csv,
)
from experiment_design.errors import TracrError


def test_run_id_sorts_by_time_and_is_unique():
    a, b = new_run_id(), new_run_id()
    assert a != b and a[:8].isdigit() and a.endswith(a[-6:])


def test_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACR_RESULTS_DIR", str(tmp_path))
    rows = [
        {
            "inference": 0,
            "item": "a.jpg",
            "split": 0,
            "layer": "input",
            "e2e_ms": 5.0,
            "edge_ms": 0.1,
            "transfer_ms": 1.0,
            "cloud_ms": 3.0,
            "bytes_raw": 10,
            "bytes_encoded": 8,
            "error": "",
        },
        {"inference": 1, "item": "b.jpg", "split": 1, "layer": "conv", "error": "link failed"},
    ]
    w = RunWriter("exp-a")
    w.add_inferences(rows)
    w.add_layers(
        [
            {
                "inference": 0,
                "instance": "edge-1",
                "side": "cloud",
                "index": 1,
                "name": "conv",
                "type": "Conv2d",
                "ms": 2.0,
            }
        ]
    )
    w.close()
    summary = build_summary(w.rows, experiment="exp-a", run_id=w.run_id, wall_s=0.01)
    w.write_json("summary.json", summary)
    assert w.dir == tmp_path / "exp-a" / w.run_id
    back = read_csv(w.dir / "inferences.csv")
    assert len(back) == 2 and list(back[0]) == INFER_COLUMNS
    assert back[1]["error"] == "link failed" and back[1]["e2e_ms"] == ""
    assert load_summary(w.dir) == json.loads(json.dumps(summary))

    import pandas as pd

    df = pd.read_csv(w.dir / "inferences.csv")
    assert len(df) == 2 and df["e2e_ms"].isna().tolist() == [False, True]
    assert len(pd.read_csv(w.dir / "layers.csv")) == 1

    w2 = RunWriter("exp-b")
    w2.close()
    w2.write_json("summary.json", {"experiment": "exp-b"})
    runs = list_runs()
    assert [r["experiment"] for r in runs] == ["exp-a", "exp-b"]
    assert find_run("last") == w2.dir
    assert find_run(w.run_id) == w.dir
    assert find_run("exp-a") == w.dir
    assert find_run("exp-a/last") == w.dir and find_run("exp-b/last") == w2.dir
    with pytest.raises(TracrError, match="No runs of 'exp-c'"):
        find_run("exp-c/last")
    assert find_run(str(w.dir)) == w.dir
    with pytest.raises(TracrError):
        find_run("no-such-run")


def test_last_without_runs_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACR_RESULTS_DIR", str(tmp_path / "empty"))
    with pytest.raises(TracrError, match="No runs"):
        find_run("last")


def test_out_dir_is_used_verbatim(tmp_path):
    w = RunWriter("x", out_dir=tmp_path / "mine")
    w.close()
    assert (tmp_path / "mine" / "inferences.csv").exists()
