"""``--resume``: a sweep whose observer was SIGKILLed is completed by a second run that measures
only what is missing; every split ends with the planned count. Real processes throughout."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from app_api.results import read_csv
from tests.integration.helpers import wait_rows

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
REPEATS = 3
SETS = ["run.warmup=1", "dataset.params.limit=1", f"partitioner.params.repeats={REPEATS}"]


def tracr(*args: str) -> list[str]:
    return [sys.executable, str(REPO / "app.py"), "experiment", "run", "alexnet-sweep",
            "--no-progress", *args]


def participants(pid: int) -> list[psutil.Process]:
    kids = psutil.Process(pid).children(recursive=True)
    return [k for k in kids if "experiment_design.participant" in " ".join(k.cmdline())]


@pytest.mark.slow
def test_resume_completes_a_killed_sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACR_RESULTS_DIR", str(tmp_path / "results"))
    first, second = tmp_path / "first", tmp_path / "second"
    proc = subprocess.Popen(tracr("--out", str(first), *sum((["--set", s] for s in SETS), [])),
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_rows(first / "inferences.csv", proc, n=8, timeout=150)
        ps = participants(proc.pid)
        proc.kill()  # the observer dies: no teardown, no gather, no summary
        proc.wait(10)
        psutil.wait_procs(ps, timeout=60)  # they notice the lost observer and exit
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (first / "summary.json").exists()
    before = read_csv(first / "inferences.csv")
    assert before and not any(r["error"] for r in before)
    kept = {p.name: p.read_bytes() for p in first.iterdir()}

    # the overrides the killed run was started with are reused; --out must be new
    r = subprocess.run(tracr("--resume", str(first), "--out", str(second)), cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    summary = json.loads((second / "summary.json").read_text())
    assert summary["resumed_from"]["run_id"] == "first"
    assert summary["resumed_from"]["rows"] == len(before)
    assert summary["status"] == "ok" and summary.get("incomplete") is None

    rows = read_csv(second / "inferences.csv")
    counts = Counter(int(x["split"]) for x in rows)
    n_splits = len(summary["splits"])
    assert n_splits > 10 and set(counts.values()) == {REPEATS}, counts
    assert len(rows) == n_splits * REPEATS == summary["inferences"]
    assert all(s["count"] == REPEATS for s in summary["splits"])
    # the measured rows are kept as they were, the new ones follow with their own numbers
    assert rows[: len(before)] == before
    assert len({x["inference"] for x in rows}) == len(rows)
    new = Counter(int(x["split"]) for x in rows[len(before):])
    old = Counter(int(x["split"]) for x in before)
    assert all(old[k] + new[k] == REPEATS for k in counts)
    assert summary["partitioner"]["edge-1"]["sweep_length"] == n_splits * REPEATS - len(before)
    # its metrics cover its own inferences, not the rows it copied (sampled by another run)
    assert summary["metrics"]["edge-1"]["inferences"] == len(rows) - len(before)
    # the killed run's directory is left exactly as it was
    assert {p.name: p.read_bytes() for p in first.iterdir()} == kept


@pytest.mark.slow
def test_resume_refuses_a_complete_run_and_out_on_a_previous_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACR_RESULTS_DIR", str(tmp_path / "results"))
    run = tmp_path / "run"
    sets = sum((["--set", s] for s in [*SETS[:2], "partitioner.params.repeats=1",
                                       "+partitioner.params.splits=[0,1]"]), [])
    r = subprocess.run(tracr("--out", str(run), *sets), cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    t0 = time.monotonic()
    again = subprocess.run(tracr("--out", str(run), *sets), cwd=REPO, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 2 and "never writes over" in again.stderr, again.stderr
    assert time.monotonic() - t0 < 30 and "Traceback" not in again.stderr
    assert len(read_csv(run / "inferences.csv")) == 2
    done = subprocess.run(tracr("--resume", str(run)), cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "nothing to resume" in done.stderr, done.stderr


@pytest.mark.slow
def test_resuming_a_run_with_a_failed_inference_redoes_it_and_ends_ok(tmp_path, monkeypatch):
    """Regression (seen in the soak): the resumed run kept the failed row of the run it
    continued and counted it as its own failure, so it ended "failed" (exit 1) although it
    had redone that inference, and so did every resume of it after (26 in a row)."""
    import csv

    monkeypatch.setenv("TRACR_RESULTS_DIR", str(tmp_path / "results"))
    run, again = tmp_path / "run", tmp_path / "again"
    sets = sum((["--set", s] for s in [*SETS[:2], "partitioner.params.repeats=2",
                                       "+partitioner.params.splits=[0,1]"]), [])
    r = subprocess.run(tracr("--out", str(run), *sets), cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    # its last inference failed (a lost partner), as a run writes it: error set, no timings
    rows = read_csv(run / "inferences.csv")
    rows[-1].update(error="link to cloud-1 failed: receiving timed out", e2e_ms="",
                    transfer_ms="", cloud_ms="")
    with open(run / "inferences.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps(dict(summary, status="failed")))

    r = subprocess.run(tracr("--resume", str(run), "--out", str(again)), cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    summary = json.loads((again / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["failed"] == 1, summary
    redone = read_csv(again / "inferences.csv")
    assert len(redone) == len(rows) + 1 and not redone[-1]["error"]
    assert redone[-1]["split"] == rows[-1]["split"]
    assert all(s["count"] == 2 for s in summary["splits"])  # the failed one not counted
    done = subprocess.run(tracr("--resume", str(again)), cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "nothing to resume" in done.stderr, done.stderr
