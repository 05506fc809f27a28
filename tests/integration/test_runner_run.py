"""End to end on the localhost device: real participant processes, real sockets."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.integration.helpers import wait_rows

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def reference_outputs(model: str, n_items: int, depth=None) -> list[tuple[int, float]]:
    """top1 and output sum of the unsplit model on the first dataset items, in this process."""
    import torch

    from experiment_design.models import get_model_spec
    from experiment_design.split import build_split_model
    from MyDatasets import create_dataset

    torch.set_num_threads(1)
    sm = build_split_model(model, seed=0, depth=depth)
    ds = create_dataset(
        "sample", input_shape=tuple(get_model_spec(model).input_shape), seed=0, limit=n_items
    )
    out = []
    with torch.inference_mode():
        for i in range(len(ds)):
            y, _ = sm.run_full(ds[i][0].unsqueeze(0))
            out.append((int(y[0].argmax()), float(y.double().sum())))
    return out


def item_names(model: str, n_items: int) -> list[str]:
    """The names of the first dataset items, in dataset order (the rows' ``item``)."""
    from experiment_design.models import get_model_spec
    from MyDatasets import create_dataset

    ds = create_dataset(
        "sample", input_shape=tuple(get_model_spec(model).input_shape), seed=0, limit=n_items
    )
    return [str(ds[i][2]) for i in range(len(ds))]


def run_and_check(name: str, overrides: list[str], tmp_path: Path, n_items: int, depth=None):
    from app_api.manifest import load_manifest
    from app_api.results import read_csv
    from app_api.runner import run_experiment

    result = run_experiment(
        load_manifest(name, overrides), out_dir=tmp_path / "run", progress=False
    )
    assert result.ok, result.errors
    s = result.summary
    rows = read_csv(result.run_dir / "inferences.csv")
    layers = read_csv(result.run_dir / "layers.csv")
    sweep = s["partitioner"]["edge-1"]["sweep_length"]
    assert len(rows) == s["inferences"] == sweep > 0 and s["failed"] == 0
    assert {f for f in ("manifest.yaml", "overrides.json", "environment.json", "summary.json")} <= {
        p.name for p in result.run_dir.iterdir()
    }
    plots = {p.name for p in (result.run_dir / "plots").iterdir()}
    # resources.png too where the run measured memory or energy per split
    assert plots - {"resources.png"} == {"best_vs_bandwidth.png", "bytes_per_split.png",
                                         "latency_per_split.png", "layers.png"}
    assert (result.run_dir / "report.html").stat().st_size > 10_000
    budget = s["latency_budget"]
    assert budget["source"] == "stages" and budget["inferences"] == len(rows)
    assert s["warmup"]["inferences"] > 0 and not s["warmup"]["recorded"]
    env = json.loads((result.run_dir / "environment.json").read_text())
    assert set(env) == {"edge-1", "cloud-1"} and all(e["threads"] == 1 for e in env.values())
    if platform.libc_ver()[0] == "glibc":  # participants keep freed memory (runtime/allocator.py)
        assert all(e["allocator"]["allocator"] == "steady" for e in env.values())
    # each side's code was built at set-up for every valid cut, none during the sweep
    assert env["edge-1"]["prepared"]["side"] == "prefix"
    assert env["cloud-1"]["prepared"]["side"] == "suffix"
    assert all(e["prepared"]["splits"] == len(s["splits"]) for e in env.values())
    # one layer row per layer per inference, and every split point of the sweep visited
    assert len(layers) % len(rows) == 0
    assert {int(r["split"]) for r in rows} == {sp["split"] for sp in s["splits"]}
    assert s["weights"] == "random" and s["wall_s"] > 0 and s["overhead"] > 0
    for key in (
        "e2e_ms_median",
        "e2e_ms_p95",
        "edge_ms_median",
        "transfer_ms_median",
        "cloud_ms_median",
        "edge_cpu_ms_median",
        "cloud_cpu_ms_median",
        "bytes_raw",
        "bytes_encoded",
        "count",
        "layer",
    ):
        assert all(key in sp for sp in s["splits"])
    # CPU time beside wall time: each side's process was charged for its own layers
    n_layers = max(sp["split"] for sp in s["splits"])
    for sp in s["splits"]:
        if 0 < sp["split"] < n_layers:
            assert sp["edge_cpu_ms_median"] > 0 and sp["cloud_cpu_ms_median"] > 0, sp
    # split runs reproduce the unsplit model, at every split point
    # each row against the unsplit output of its own input (a sweep's visit order decides
    # which input an inference gets: rows name it)
    ref = dict(zip(item_names(s["model"], n_items), reference_outputs(s["model"], n_items, depth),
                   strict=True))
    for r in rows:
        top1, total = ref[r["item"]]
        assert int(r["top1"]) == top1, r
        assert abs(float(r["output_sum"]) - total) <= 1e-4 * max(1.0, abs(total)), r
    return result


def test_alexnet_sweep(tmp_path):
    run_and_check(
        "alexnet-sweep",
        ["partitioner.params.repeats=1", "dataset.params.limit=2", "run.warmup=1"],
        tmp_path,
        n_items=2,
    )


def test_resnet18_sweep(tmp_path):
    # block boundaries only and one input per split keep this under a minute on 2 cores
    res = run_and_check(
        "resnet18-sweep",
        ["partitioner.params.repeats=1", "dataset.params.limit=1", "run.warmup=1", "model.depth=2"],
        tmp_path,
        n_items=1,
        depth=2,
    )
    assert max(int(sp["split"]) for sp in res.summary["splits"]) > 3


def start_cli(tmp_path: Path, *overrides: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        str(REPO / "app.py"),
        "experiment",
        "run",
        "alexnet-sweep",
        "--no-progress",
        "--out",
        str(tmp_path / "run"),
        "--set",
        "run.warmup=1",
        "--set",
        "dataset.params.limit=1",
        *sum((["--set", o] for o in overrides), []),
    ]
    return subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def participants(proc: subprocess.Popen) -> list[psutil.Process]:
    kids = psutil.Process(proc.pid).children(recursive=True)
    return [k for k in kids if "experiment_design.participant" in " ".join(k.cmdline())]


def workdirs(ps: list[psutil.Process]) -> list[str]:
    out = []
    for p in ps:
        cmd = p.cmdline()
        out.append(cmd[cmd.index("--workdir") + 1])
    return out


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_signal_mid_run_leaves_nothing_behind(tmp_path, sig):
    proc = start_cli(tmp_path, "partitioner.params.repeats=50")
    try:
        wait_rows(tmp_path / "run" / "inferences.csv", proc, timeout=120)
        ps = participants(proc)
        assert len(ps) == 2
        dirs = workdirs(ps)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert all(gone(p.pid) for p in ps)
    assert not any(os.path.exists(d) for d in dirs)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["inferences"] >= 2
    # where the partial run is, and how to continue it (before: only "interrupted")
    assert f"interrupted: the partial run is in {tmp_path / 'run'}" in err
    assert f"--resume {tmp_path / 'run'}" in err


@pytest.mark.slow
def test_killed_participant_fails_the_run_with_an_error_row(tmp_path):
    proc = start_cli(tmp_path, "partitioner.params.repeats=50")
    try:
        wait_rows(tmp_path / "run" / "inferences.csv", proc, timeout=120)
        ps = participants(proc)
        dirs = workdirs(ps)
        cloud = next(p for p in ps if "cloud" in p.cmdline()[p.cmdline().index("--role") + 1])
        cloud.kill()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert "cloud-1" in err
    assert all(gone(p.pid) for p in ps)
    assert not any(os.path.exists(d) for d in dirs)
    from app_api.results import read_csv

    rows = read_csv(tmp_path / "run" / "inferences.csv")
    bad = [r for r in rows if r["error"]]
    assert bad and "link to cloud-1 failed" in bad[-1]["error"] and bad[-1]["e2e_ms"] == ""
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failed"] >= 1
