"""Results survive crashes, full disks and reuse: real faults (SIGKILL, RLIMIT_FSIZE), no mocks."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app_api.results import RunWriter, read_csv
from experiment_design.errors import TracrError

REPO = Path(__file__).resolve().parents[2]
ROW = {"inference": 0, "item": "a.jpg", "split": 1, "layer": "conv", "e2e_ms": 5.0, "error": ""}
LAYER = {"inference": 0, "instance": "edge-1", "side": "edge", "index": 1, "name": "conv",
         "type": "Conv2d", "ms": 2.0}


def small_files(limit: int):
    """preexec_fn: files may not grow past ``limit`` bytes; a write past it fails with EFBIG
    (SIGXFSZ ignored) instead of killing the process."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return apply


def run_py(code: str, limit: int | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          preexec_fn=small_files(limit) if limit else None, **kw)


def test_out_pointing_at_a_previous_run_is_refused_and_kept(tmp_path):
    w = RunWriter("x", out_dir=tmp_path / "run")
    w.add_inferences([ROW, {**ROW, "inference": 1}])
    w.write_json("summary.json", {"inferences": 2})
    w.close()
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    with pytest.raises(TracrError) as e:
        RunWriter("x", out_dir=tmp_path / "run")
    assert e.value.exit_code == 2 and "never writes over" in e.value.message
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before


def test_an_empty_out_directory_is_fine(tmp_path):
    (tmp_path / "run").mkdir()
    RunWriter("x", out_dir=tmp_path / "run").close()
    assert read_csv(tmp_path / "run" / "inferences.csv") == []


def test_formula_cells_are_escaped_numbers_untouched(tmp_path):
    w = RunWriter("x", out_dir=tmp_path / "run")
    evil = {**ROW, "item": "=HYPERLINK(\"http://x\")", "label": "-3", "e2e_ms": -5.0,
            "error": "+cmd|' /C calc'!A0", "host": "@SUM(1)", "instance": "\tedge", "layer": "-x",
            "partner": "\rcloud"}
    w.add_inferences([evil])
    w.close()
    back = read_csv(tmp_path / "run" / "inferences.csv")[0]
    assert back["item"] == "'=HYPERLINK(\"http://x\")"
    assert back["error"] == "'+cmd|' /C calc'!A0" and back["host"] == "'@SUM(1)"
    assert back["instance"] == "'\tedge" and back["layer"] == "'-x" and back["partner"] == "'\rcloud"
    assert back["label"] == "-3" and back["e2e_ms"] == "-5.0" and back["split"] == "1"
    from app_api.results import safe_cell

    assert safe_cell(safe_cell("=1+1")) == "'=1+1" and safe_cell(-2) == -2


def test_a_killed_writer_leaves_every_completed_row(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from app_api.results import RunWriter
        w = RunWriter("x", out_dir={str(tmp_path / "run")!r})
        for i in range(5):
            w.add_inferences([{{**{ROW!r}, "inference": i}}])
            w.add_layers([{{**{LAYER!r}, "inference": i}}] * 3)
        print("written", flush=True)
        time.sleep(60)
    """)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "written"
    finally:
        proc.kill()
        proc.wait(10)
    assert len(read_csv(tmp_path / "run" / "inferences.csv")) == 5
    assert len(read_csv(tmp_path / "run" / "layers.csv")) == 15


def test_a_failed_json_write_keeps_the_previous_file(tmp_path):
    run = tmp_path / "run"
    w = RunWriter("x", out_dir=run)
    w.write_json("summary.json", {"status": "ok", "note": "the complete one"})
    w.close()
    before = (run / "summary.json").read_text()
    r = run_py(f"""
        import sys
        from pathlib import Path
        from app_api.results.store import RunWriter
        w = RunWriter.__new__(RunWriter)
        w.dir = Path({str(run)!r})
        try:
            w.write_json("summary.json", {{"big": "x" * 100_000}})
        except Exception as exc:
            print(type(exc).__name__, getattr(exc, "reason", exc))
            sys.exit(3)
    """, limit=4096)
    assert r.returncode == 3, r.stderr
    assert (run / "summary.json").read_text() == before
    assert r.stdout.startswith("ResultsWriteError") and "file size limit" in r.stdout
    assert [p.name for p in run.iterdir() if p.name.endswith(".tmp")] == []


def test_a_full_file_cuts_back_to_the_last_complete_row(tmp_path):
    run = tmp_path / "run"
    r = run_py(f"""
        import sys
        from app_api.results import RunWriter
        w = RunWriter("x", out_dir={str(run)!r})
        try:
            for i in range(10_000):
                w.add_inferences([{{**{ROW!r}, "inference": i, "item": "x" * 50}}])
        except Exception as exc:
            print(i, getattr(exc, "reason", repr(exc)), getattr(exc, "exit_code", None))
            sys.exit(3)
    """, limit=8192)
    assert r.returncode == 3, r.stderr
    n, *reason = r.stdout.split()
    assert "inferences.csv" in " ".join(reason) and reason[-1] == "1", r.stdout
    text = (run / "inferences.csv").read_text()
    assert text.endswith("\n") and len(read_csv(run / "inferences.csv")) == int(n)


def test_a_summary_too_big_for_the_disk_becomes_a_small_one(tmp_path):
    run = tmp_path / "run"
    RunWriter("x", out_dir=run).close()
    (run / "inferences.csv").unlink()
    (run / "layers.csv").unlink()
    r = run_py(f"""
        from pathlib import Path
        from app_api.results.store import RunWriter
        from app_api.runner.gather import write_summary
        w = RunWriter.__new__(RunWriter)
        w.dir = Path({str(run)!r})
        summary = {{"experiment": "x", "run_id": "r", "status": "ok", "incomplete": None,
                    "inferences": 3, "errors": [], "splits": [{{"pad": "x" * 100}}] * 200}}
        print(write_summary(w, summary))
    """, limit=4096)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
    small = json.loads((run / "summary.json").read_text())
    assert small["status"] == "failed" and small["inferences"] == 3
    assert "summary.json" in small["incomplete"]["reason"] and "splits" not in small


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (what sudo gives)")
def test_under_sudo_the_run_directory_stays_the_users(tmp_path, monkeypatch):
    monkeypatch.setenv("SUDO_UID", "12345")
    monkeypatch.setenv("SUDO_GID", "12346")
    monkeypatch.setenv("TRACR_RESULTS_DIR", str(tmp_path / "results"))
    w = RunWriter("exp")
    w.add_inferences([ROW])
    w.write_json("summary.json", {"status": "ok"})
    w.close()
    for p in [tmp_path / "results", tmp_path / "results" / "exp", *w.dir.parent.iterdir(),
              *w.dir.iterdir()]:
        st = p.stat()
        assert (st.st_uid, st.st_gid) == (12345, 12346), p
