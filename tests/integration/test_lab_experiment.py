"""An AlexNet sweep across two lab hosts: deploy over SSH, shaped transfers, nothing left behind."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.lab, pytest.mark.ssh]

RATE = 4e6  # bytes/s, the lab's configured link


def _ns_pids(ns: str) -> set[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def test_alexnet_sweep_on_the_lab(cfg):
    from app_api import lab
    from app_api.devices.registry import DeviceRegistry
    from app_api.manifest import load_manifest
    from app_api.runner.labfacts import lab_facts
    from app_api.runner.observer import Observer

    if subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.strip():
        pytest.skip("network namespaces already exist on this machine")
    state = lab.up(hosts=2, bandwidth="4MB/s", cpu_quota=["lab-1=0.5"])
    sshds = {h["ns"]: h["sshd_pid"] for h in state["hosts"]}
    try:
        manifest = load_manifest(
            "alexnet-sweep-lab",
            [
                "+partitioner.params.splits=[0,8,21]",
                "partitioner.params.repeats=1",
                "dataset.params.limit=2",
                "run.warmup=1",
            ],
        )
        observer = Observer(
            manifest, out_dir=cfg / "run", progress=False, facts=lab_facts(manifest)
        )
        result = observer.run()
        assert result.ok, result.errors
        # The lab hosts share this filesystem: their /tmp/tracr-* work dirs are visible here.
        workdirs = [h.workdir for h in observer.handles.values()]
        assert len(workdirs) == 2 and all(w and w.startswith("/tmp/tracr-") for w in workdirs)
        assert not [w for w in workdirs if os.path.exists(w)]
        splits = {s["split"]: s for s in result.summary["splits"]}
        assert set(splits) == {0, 8, 21}

        # The input (split 0) crosses the shaped link: its transfer takes about
        # bytes / rate (unshaped, the same bytes would take a few milliseconds).
        s0 = splits[0]
        at_rate_ms = s0["bytes_encoded"] / RATE * 1e3
        assert s0["bytes_encoded"] > 50_000
        assert 0.6 * at_rate_ms < s0["transfer_ms_median"] < 4 * at_rate_ms + 50
        # Fewer bytes cross at the last split, so its transfer is shorter.
        assert splits[21]["transfer_ms_median"] < s0["transfer_ms_median"]

        report = lab.link_report()
        assert report["bandwidth_Bps"] == pytest.approx(RATE, rel=0.25)
        # the lab link, as configured and measured, is part of the run's results
        recorded = result.summary["network"]["lab"]
        assert recorded["bandwidth_Bps"] == pytest.approx(RATE, rel=0.25)
        assert recorded["rtt_ms"] > 0

        # Participants removed themselves: only the hosts' sshds remain in the namespaces.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(
            _ns_pids(ns) - {pid} for ns, pid in sshds.items()
        ):
            time.sleep(0.2)
        assert all(_ns_pids(ns) == {pid} for ns, pid in sshds.items())
    finally:
        lab.down()
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "tracr-lab-" not in out
    assert not [
        pid for pid in sshds.values() if subprocess.run(["kill", "-0", str(pid)]).returncode == 0
    ]
    assert not [n for n in DeviceRegistry.load().names() if n.startswith("lab-")]
