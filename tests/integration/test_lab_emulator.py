"""The user-space link emulator on this kernel: delay + loss + rate verified, a trace-driven
link, and a killed emulator named at once (never a hung verify or run)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.lab]


def _failed(result: dict) -> list[dict]:
    return [r for r in result["rows"] if r["ok"] is False]


def _links() -> str:
    return subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout


def test_delay_loss_and_rate_meet_their_configuration(cfg):
    from app_api import lab
    from app_api.lab import timeline, verify

    lab.up(hosts=2, bandwidth="16Mbit", delay_ms="20ms", loss="1%", link_mode="user",
           verify=False)
    try:
        state = lab.status()
        assert state["links"]["mechanism"] == "user"
        assert state["emulator"]["alive"]
        pid = state["emulator"]["pid"]
        result = verify.verify_lab(quick=True)
        assert result["ok"], _failed(result)
        checks = {(r["check"], r["link"]) for r in result["rows"] if r["ok"]}
        assert {("goodput 64 KiB", "lab-1 up"), ("goodput 1 MiB", "lab-2 up"),
                ("loss", "lab-1 up"), ("round trip", "lab-1 <-> lab-2")} <= checks
        pair = next(r for r in result["rows"] if r["link"] == "lab-1 <-> lab-2")
        # 20 ms on each host's egress, and a 59-byte ping at 16 Mbit/s on each
        assert pair["configured"] == pytest.approx(40 + 2 * 0.0295, abs=0.001)
        assert lab.load_state()["verify"]["ok"]
        rows = timeline.link_timeline(time.time() - 60, time.time())
        up = [r for r in rows if r["link"] == "lab-1" and r["dir"] == "up"]
        assert up and up[0]["delay_ms"] == 20 and up[0]["loss"] == 0.01
        assert up[0]["rate_Bps"] == 2e6 and up[0]["mechanism"] == "user"
    finally:
        removed = lab.down()
    assert pid in removed["processes"]
    assert "trlab-" not in _links()


def test_a_trace_driven_link_follows_the_trace(cfg, tmp_path):
    from app_api import lab
    from app_api.lab import timeline, verify

    lab.up(hosts=1, bandwidth="8Mbit", trace="step", verify=False)
    started = time.time()
    try:
        assert lab.status()["links"]["mechanism"] == "user"
        result = verify.verify_lab(quick=True)
        assert result["ok"], _failed(result)
        time.sleep(max(0.0, started + 5.5 - time.time()))  # into the trace's second step
        # a user's own Mahimahi trace: 4 opportunities each ms, 48.5 Mbit/s
        path = tmp_path / "own.trace"
        path.write_text("".join(f"{ms}\n" * 4 for ms in range(1, 201)))
        lab.shape(trace=str(path), verify=False)
        result = verify.verify_lab(quick=True)
        assert result["ok"], _failed(result)
        good = [r for r in result["rows"] if r["check"].startswith("goodput")
                and r["link"] == "lab-1 up"]
        assert good and all(r["configured"] == pytest.approx(4 * 1514e3 * 1472 / 1514, rel=0.02)
                            for r in good)
        rows = timeline.link_timeline(time.time() - 120, time.time())
        steps = {round(r["rate_Bps"]) for r in rows if r["event"] == "step"}
        assert {1_500_000, 500_000} <= steps  # step: 1.5 and 0.5 x 1 MB/s
    finally:
        lab.down()


def test_a_killed_emulator_is_named_at_once(cfg):
    from app_api import lab
    from app_api.lab import verify
    from app_api.manifest import load_manifest
    from app_api.runner import labcheck
    from experiment_design.errors import TracrError

    lab.up(hosts=2, delay_ms="5ms", verify=False)
    try:
        pid = lab.load_state()["emulator"]["pid"]
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        t = time.monotonic()
        with pytest.raises(TracrError, match=rf"link emulator \(pid {pid}\) is not running"):
            verify.verify_lab(quick=True)
        manifest = load_manifest("alexnet-sweep-lab")
        with pytest.raises(TracrError, match="link emulator"):
            labcheck.check_lab(manifest)
        assert time.monotonic() - t < 5
        assert lab.status()["emulator"]["alive"] is False
    finally:
        lab.down()
    assert "trlab-" not in _links()
    # the dead emulator is not left a zombie of this process: lab down finds helpers by
    # their command line, which a zombie has lost, so it was never reaped (two were left in
    # the full suite); helpers are now started so that init, not lab up's caller, owns them
    assert pid not in [c.pid for c in psutil.Process().children()]


@pytest.mark.ssh
@pytest.mark.slow
def test_a_run_whose_emulator_is_killed_ends_naming_it(cfg, tmp_path):
    import csv
    import sys
    from pathlib import Path

    from app_api import lab

    repo = Path(__file__).resolve().parents[2]
    lab.up(hosts=2, bandwidth="16Mbit", delay_ms="5ms", verify=False)
    out = tmp_path / "run"
    argv = [sys.executable, "app.py", "experiment", "run", "alexnet-sweep-lab", "--out", str(out),
            "--no-progress", "--set", "partitioner.params.repeats=4",
            "--set", "dataset.params.limit=4", "--set", "run.warmup=1"]
    log = open(tmp_path / "run.log", "w+")  # noqa: SIM115 - closed below
    run = subprocess.Popen(argv, cwd=repo, env=dict(os.environ, PYTHONPATH=str(repo)),
                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def rows() -> int:
        try:
            with open(out / "inferences.csv") as fh:
                return sum(1 for _ in csv.reader(fh)) - 1
        except OSError:
            return 0

    try:
        deadline = time.monotonic() + 180
        while rows() < 1 and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert run.poll() is None and rows() >= 1, "no inference measured in time"
        os.kill(lab.load_state()["emulator"]["pid"], signal.SIGKILL)
        killed = time.monotonic()
        rc = run.wait(timeout=150)  # the liveness timeout, then teardown: never a hang
        log.seek(0)
        output = log.read()
        print(f"the run ended {time.monotonic() - killed:.1f} s after the emulator was killed")
        assert rc == 1, output[-3000:]
        assert "link emulator" in output and "is not running" in output, output[-3000:]
        assert "Traceback" not in output
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        log.close()
        lab.down()
