"""A full disk during a run: the run stops cleanly, summary.json is still written, readable and
marked incomplete, exit 1, no traceback. The fault is real: RLIMIT_FSIZE on the observer (with
SIGXFSZ ignored, so writes past it fail with EFBIG as on a full disk)."""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app_api.results import read_csv

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
LIMIT = 24 * 1024  # layers.csv (about 1.3 KiB per AlexNet inference) is full after ~18


def _small_files() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


@pytest.mark.slow
def test_file_size_limit_mid_run_leaves_a_summary_marked_incomplete(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, str(REPO / "app.py"), "experiment", "run", "alexnet-sweep",
           "--no-progress", "--out", str(out), "--set", "run.warmup=1",
           "--set", "dataset.params.limit=1", "--set", "partitioner.params.repeats=50"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                          preexec_fn=_small_files)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed"
    reason = summary["incomplete"]["reason"]
    assert "layers.csv" in reason and "file size limit" in reason
    # the rows measured before the disk filled are kept, whole
    rows = read_csv(out / "inferences.csv")
    assert 0 < len(rows) < 22 * 50 and summary["inferences"] == len(rows)
    assert (out / "layers.csv").read_text().endswith("\n")
    assert "file size limit" in proc.stderr
