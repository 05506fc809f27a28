"""A reduced Neurosurgeon reproduction over two lab bandwidths: reshaping, the group, restore.

Brings a two-host lab up, runs ``tracr experiment run neurosurgeon-alexnet`` with a
two-rate ``network.bandwidths`` list (a few split points, one inference each), and
checks each run's partitioners table and measured link, the group summary and its
``tracr results show`` table, and that the lab's own shaping was put back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.lab, pytest.mark.ssh]

ROOT = Path(__file__).parents[2]
RATES = ["16MB/s", "64MB/s"]


def _tracr(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=dict(os.environ),
    )


@pytest.mark.timeout(240)
def test_bandwidth_loop_on_the_lab(cfg):
    from app_api import lab

    if subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.strip():
        pytest.skip("network namespaces already exist on this machine")
    lab.up(hosts=2, bandwidth="4MB/s", cpu_quota=["lab-1=0.5"])
    try:
        group = cfg / "group"
        proc = _tracr(
            "experiment",
            "run",
            "neurosurgeon-alexnet",
            "--no-progress",
            "--out",
            str(group),
            "--set",
            f"network.bandwidths=[{', '.join(RATES)}]",
            "--set",
            "partitioner.params.repeats=2",
            "--set",
            "+partitioner.params.refine=2",
            "--set",
            "~partitioner.params.race",
            "--set",
            "partitioner.params.contenders=2",
            "--set",
            "+partitioner.params.splits=[0,3,6,13,22]",
            "--set",
            "dataset.params.limit=1",
            "--set",
            "run.warmup=1",
            # the manifest states a paced edge at 0.25 core; this lab has a plain 0.5 quota
            "--set",
            "lab.on_mismatch=record",
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        doc = json.loads((group / "group.json").read_text())
        assert doc["status"] == "ok" and [r["bandwidth"] for r in doc["rows"]] == RATES
        for row, rate in zip(doc["rows"], (16e6, 64e6), strict=True):
            run = json.loads((group / row["run"] / "summary.json").read_text())
            lab_link = run["network"]["lab"]
            check = run["lab_check"]
            assert check["used"] and not check["ok"]
            assert check["differences"] == [
                {"what": "lab-1 cpu", "wanted": "0.25 core", "found": "0.5 core"}]
            assert lab_link["configured"]["bandwidth_Bps"] == rate
            assert lab_link["bandwidth_Bps"] == pytest.approx(rate, rel=0.35)
            parts = run["partitioners"]
            assert set(parts) == {"neurosurgeon", "predicted-argmin", "measured"}
            measured = {s["split"]: s["e2e_ms_median"] for s in run["splits"]}
            assert set(measured) == {0, 3, 6, 13, 22}
            # the walk measured each split twice, then the two fastest twice more each
            assert sorted(s["count"] for s in run["splits"]) == [2, 2, 2, 4, 4]
            for p in parts.values():
                assert p["best"] == min(measured, key=measured.get)
                assert p["chosen"] in measured and p["regret"] >= 1.0
            assert parts["measured"]["regret"] == 1.0
            assert row["best"] == parts["measured"]["best"]
            noise = run["measurement_noise"]
            assert noise["regret"] >= 1.0 and noise["repeats_min"] == 2
            assert row["noise_regret"] == noise["regret"]
            # the two refined splits alone: 4 repeats each
            among = noise["contenders"]
            assert among["splits"] == 2 and among["repeats_min"] == 4
            assert row["noise_contenders"] == among["regret"]
            # the quota'd edge timed cold passes; predicted-argmin read its prefixes off them
            doc_p = json.loads((group / row["run"] / "partitioners.json").read_text())
            edge_prof = doc_p["inputs"]["edge_profile"]
            assert edge_prof["cpu_quota"]["fraction"] == 0.5
            assert len(edge_prof["prefix_cold_ms"]) == len(edge_prof["layers"])
            dec = doc_p["evaluation"]["predicted-argmin"]["decision"]
            assert dec["source"]["edge"]["throttle"]["model"] == "cold prefix curve"
            assert (
                row["partitioners"]["predicted-argmin"]["chosen"]
                == parts["predicted-argmin"]["chosen"]
            )
        # the lab's shaping from before the loop is back
        assert lab.link_report()["configured"]["bandwidth"] == "4MB/s"

        show = _tracr("results", "show", str(group), timeout=60)
        assert show.returncode == 0, show.stderr
        assert all(r in show.stdout for r in RATES) and "predicted-argmin" in show.stdout
        assert "noise among the raced or refined contenders alone: 16MB/s" in show.stdout
        assert "noise" in show.stdout
        one = _tracr("results", "show", str(group / doc["rows"][0]["run"]), timeout=60)
        assert one.returncode == 0 and "measurement noise: split-half regret" in one.stdout
    finally:
        lab.down()
