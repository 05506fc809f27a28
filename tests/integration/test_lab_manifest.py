"""A manifest states its lab and its link: `tracr lab up --manifest` brings up the stated lab,
and a run shapes the delay, loss and jitter its network section asks for (on this kernel,
through the user-space link emulator), then puts the lab's link back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.lab, pytest.mark.ssh]

ROOT = Path(__file__).resolve().parents[2]


def _tracr(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=dict(os.environ))


@pytest.mark.timeout(420)
def test_the_stated_lab_and_a_lossy_delayed_link_from_the_manifest(cfg, tmp_path):
    from app_api import lab

    up = _tracr("lab", "up", "--manifest", "alexnet-sweep-lab", "--no-verify")
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    try:
        state = lab.load_state()
        assert [h.get("cpu_quota") for h in state["hosts"]] == [0.25, None]
        assert state["hosts"][0]["cpu_mode"] == "quota"
        out = tmp_path / "run"
        proc = _tracr("experiment", "run", "alexnet-sweep-lab", "--no-progress", "--out",
                      str(out), "--set", "network.bandwidth=16Mbit", "--set",
                      "network.delay_ms=20", "--set", "network.loss_pct=1", "--set",
                      "network.jitter_ms=1", "--set", "+partitioner.params.splits=[0,22]",
                      "--set", "partitioner.params.repeats=2", "--set",
                      "dataset.params.limit=1", "--set", "run.warmup=1")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "ok" and summary["lab_check"]["ok"]
        configured = summary["network"]["lab"]["configured"]
        assert configured["mechanism"] == "user"  # no netem here: the emulator carries it
        request = configured["request"]
        assert request["loss"] == "1%" and request["jitter"] == 1.0
        assert configured["delay_ms"] == 20
        # split 22 sends 4 KB: its transfer is the 40 ms round trip between the hosts
        by_split = {s["split"]: s for s in summary["splits"]}
        assert by_split[22]["transfer_ms_median"] > 38
        # the lab's own link is back: no delay, no loss, no emulator needed
        after = lab.link_report()["configured"]
        assert not after.get("delay_ms") and not (after.get("request") or {}).get("loss")
    finally:
        lab.down()
