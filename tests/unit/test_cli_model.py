"""`tracr model` through a real process: JSON on stdout, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _tracr(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "app.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )


def test_model_splits_verify_json():
    proc = _tracr("model", "splits", "alexnet", "--verify", "--json", "--input-shape", "3x64x64")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["index"] for r in rows] == list(range(len(rows)))
    assert rows[0]["name"] == "input"
    for r in rows:
        assert {"index", "name", "crossing_bytes", "max_abs_diff", "mode"} <= set(r)
        assert r["mode"] == "graph"
        assert r["max_abs_diff"] is not None and r["max_abs_diff"] <= 1e-5


def test_model_splits_unknown_model_exits_2_with_one_line():
    proc = _tracr("model", "splits", "resnet19")
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("error: Unknown model 'resnet19'. Did you mean 'resnet18'?")
    assert len([ln for ln in lines if ln.startswith("error:")]) == 1
    assert "Traceback" not in proc.stderr


def test_model_splits_bad_depth_exits_2():
    proc = _tracr("model", "splits", "resnet18", "--depth", "-1")
    assert proc.returncode == 2
    assert "depth" in proc.stderr and "Traceback" not in proc.stderr


def test_model_ls_json():
    proc = _tracr("model", "ls", "--json")
    assert proc.returncode == 0, proc.stderr
    names = {r["name"] for r in json.loads(proc.stdout)}
    assert {"alexnet", "resnet18", "efficientnet_b0"} <= names


@pytest.mark.slow
def test_model_splits_of_a_shape_computing_model_are_all_valid_and_exact():
    # shufflenet computes x.size() and channels // 2: those cuts were invalid (198 of 368
    # valid); --tolerance 0 asks for split == unsplit exactly at every cut
    proc = _tracr(
        "model", "splits", "torchvision:shufflenet_v2_x1_0", "--verify", "--json",
        "--input-shape", "3x64x64", "--tolerance", "0",
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert len(rows) == 368 and all(r["valid"] for r in rows)
    assert all(r["max_abs_diff"] == 0.0 for r in rows)

