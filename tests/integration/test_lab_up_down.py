"""The emulated lab end to end on this machine: namespaces, sshd, shaping, quotas, teardown."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.lab]


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACR_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("TRACR_DEVICES", str(tmp_path / "devices.yaml"))
    return tmp_path


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith("tracr-lab-")]


def _links() -> list[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True).stdout
    return [link["ifname"] for link in json.loads(out) if link["ifname"].startswith("trlab-")]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _ssh(state: dict, address: str, command: str) -> subprocess.CompletedProcess:
    argv = [
        "ssh", "-i", state["client_key"], "-o", "IdentitiesOnly=yes",
        "-o", f"UserKnownHostsFile={state['known_hosts']}", "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
        f"root@{address}", command,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


_SINK = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5999)); s.listen(1); print("ready", flush=True)
c, _ = s.accept()
while True:
    need = int.from_bytes(c.recv(8, socket.MSG_WAITALL) or b"\\0" * 8, "big")
    if not need:
        break
    while need:
        need -= len(c.recv(min(need, 1 << 20)))
    c.sendall(b"k")
"""
_SEND = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], 5999), timeout=30)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
n = int(sys.argv[2])
for _ in range(3):
    t = time.perf_counter(); c.sendall(n.to_bytes(8, "big") + b"x" * n); c.recv(1)
    print(time.perf_counter() - t)
    time.sleep(0.1)
c.sendall((0).to_bytes(8, "big"))
"""


def _transfer_without_loss(sender: dict, receiver: dict, nbytes: int) -> list[float]:
    """Send ``nbytes`` three times between two lab hosts; seconds each (asserts no drops)."""
    import sys

    def drops() -> int:
        out = subprocess.run(["ip", "netns", "exec", sender["ns"], "tc", "-s", "-j", "qdisc",
                              "show", "dev", sender["veth_ns"]], capture_output=True, text=True)
        return sum(q.get("drops", 0) for q in json.loads(out.stdout))

    before = drops()
    sink = subprocess.Popen(["ip", "netns", "exec", receiver["ns"], sys.executable, "-c", _SINK],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout.readline().strip() == "ready"
        r = subprocess.run(["ip", "netns", "exec", sender["ns"], sys.executable, "-c", _SEND,
                            receiver["address"], str(nbytes)], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        assert sink.wait(timeout=10) == 0
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait()
    assert drops() == before  # the shaper queued every packet; TCP never had to resend
    return [float(v) for v in r.stdout.split()]


def _assert_nothing_left(cfg: Path, pids: list[int]) -> None:
    assert _namespaces() == []
    assert _links() == []
    assert not [p for p in pids if _alive(p)]
    assert not list(Path("/sys/fs/cgroup/cpu").glob("tracr-lab-*"))
    assert not (cfg / "lab").exists()


def test_lab_up_ssh_shaping_quota_and_down(cfg):
    from app_api import lab
    from app_api.devices.registry import DeviceRegistry

    if _namespaces():
        pytest.skip("a tracr lab is already up on this machine")
    state = lab.up(hosts=2, bandwidth="4MB/s", cpu_quota=["lab-1=0.25"])
    pids = [h["sshd_pid"] for h in state["hosts"]]
    try:
        assert sorted(_namespaces()) == ["tracr-lab-1", "tracr-lab-2"]
        assert json.loads(lab.state_path().read_text())["complete"] is True
        for h in state["hosts"]:
            assert _alive(h["sshd_pid"])
            with socket.create_connection((h["address"], 22), timeout=5) as s:  # from the root ns
                assert s.recv(4) == b"SSH-"

        # Key login as root, host key checked against tracr's known_hosts.
        r = _ssh(state, "10.213.0.2", "cat /proc/self/cgroup; ip -o -4 addr show")
        assert r.returncode == 0, r.stderr
        assert "tracr-lab-1" in r.stdout  # the session inherited sshd's cgroup
        assert "10.213.0.2/24" in r.stdout
        # one CPU per host (this machine has at least as many CPUs as hosts), inherited
        # by every session sshd starts
        if len(os.sched_getaffinity(0)) >= 2:
            assert state["pinned"] and [h["cpus"] for h in state["hosts"]] == [
                [c] for c in sorted(os.sched_getaffinity(0))[:2]]
            for h in state["hosts"]:
                assert os.sched_getaffinity(h["sshd_pid"]) == set(h["cpus"])
                r = _ssh(state, h["address"], "grep Cpus_allowed_list /proc/self/status")
                assert r.stdout.split()[-1] == str(h["cpus"][0]), r.stdout
            assert lab.link_report()["cpus"] == {h["name"]: h["cpus"] for h in state["hosts"]}
        assert _ssh(state, "10.213.0.3", "true").returncode == 0

        # Paired in the device registry.
        reg = DeviceRegistry.load()
        dev = reg.get("lab-1")
        assert (dev.host, dev.user, dev.data_host, dev.tags) == (
            "10.213.0.2",
            "root",
            "10.213.0.2",
            ["lab"],
        )
        assert Path(dev.key) == Path(state["client_key"])

        # Shaped and measured: TCP payload within 25% of the configured rate.
        report = lab.link_report()
        assert report["configured"]["bandwidth_Bps"] == 4e6
        assert report["bandwidth_Bps"] == pytest.approx(4e6, rel=0.25)
        assert 0 < report["rtt_ms"] < 50
        readings = report["measured"]["rate_readings_Bps"]  # re-probed only if far below
        assert 1 <= len(readings) <= 3 and round(report["bandwidth_Bps"]) == max(readings)
        # on a slow link a transfer larger than 50 ms of traffic is queued, not dropped, so
        # it takes bytes / rate (with a shallow queue TCP waited out retransmission timeouts)
        lab.shape("1MB/s", verify=False)
        secs = _transfer_without_loss(state["hosts"][0], state["hosts"][1], 300_000)
        assert len(secs) == 3 and min(secs) > 0.25  # 0.3 s at 1 MB/s, not line rate
        lab.shape("4MB/s")

        # a quarter of a core per 10 ms period (the default): evenly slower, not stalling
        v1 = Path("/sys/fs/cgroup/cpu/tracr-lab-1")
        if (v1 / "cpu.cfs_quota_us").exists():
            assert (v1 / "cpu.cfs_quota_us").read_text().strip() == "2500"
            assert (v1 / "cpu.cfs_period_us").read_text().strip() == "10000"
        else:
            assert Path("/sys/fs/cgroup/tracr-lab-1/cpu.max").read_text().split() == [
                "2500", "10000"]
        assert report["cpu"]["lab-1"]["quota"] == 0.25
        assert report["cpu"]["lab-1"]["period_us"] == 10_000
        assert 0 < report["cpu"]["lab-1"]["measured"] < 0.4
    finally:
        removed = lab.down()
    assert set(removed["namespaces"]) == {"tracr-lab-1", "tracr-lab-2"}
    assert set(removed["registry"]) == {"lab-1", "lab-2"}
    _assert_nothing_left(cfg, pids)
    assert "lab-1" not in DeviceRegistry.load()
    assert "10.213.0.2" not in (cfg / "known_hosts").read_text()
    assert lab.link_report() == {}
    assert not any(lab.down().values())  # idempotent


def test_lab_down_cleans_a_partial_lab_without_state(cfg):
    """A lab whose state file is gone (crash during up) is still found by name and removed."""
    from app_api import lab

    if _namespaces():
        pytest.skip("a tracr lab is already up on this machine")
    subprocess.run(["ip", "netns", "add", "tracr-lab-9"], check=True)
    subprocess.run(
        ["ip", "link", "add", "trlab-9h", "type", "veth", "peer", "name", "trlab-9n"], check=True
    )
    subprocess.run(["ip", "link", "add", "trlab-br0", "type", "bridge"], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", "tracr-lab-9", "sleep", "60"])
    try:
        removed = lab.down()
        assert removed["namespaces"] == ["tracr-lab-9"]
        assert sleeper.pid in removed["processes"]
        assert set(removed["links"]) >= {"trlab-br0"}
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        sleeper.wait()
    _assert_nothing_left(cfg, [sleeper.pid])


def test_lab_cli_up_ls_down(cfg, capsys):
    """The command line: up without shaping, ls as JSON, down."""
    if _namespaces():
        pytest.skip("a tracr lab is already up on this machine")
    import app

    try:
        assert app.main(["lab", "up", "--hosts", "1", "--no-verify", "--no-pin", "--cpu-quota",
                         "lab-1=0.5", "--cpu-period-ms", "20"]) == 0
        capsys.readouterr()
        assert app.main(["lab", "ls", "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert [(h["name"], h["alive"]) for h in listed["hosts"]] == [("lab-1", True)]
        assert listed["hosts"][0]["cpu_period_us"] == 20_000
        assert listed["pinned"] is False and "cpus" not in listed["hosts"][0]
        assert os.sched_getaffinity(listed["hosts"][0]["sshd_pid"]) == os.sched_getaffinity(0)
        assert 0.3 < listed["hosts"][0]["cpu_measured"] < 0.6
        assert app.main(["lab", "up", "--hosts", "1"]) == 2  # refuses a second lab
    finally:
        assert app.main(["lab", "down"]) == 0
    assert _namespaces() == [] and _links() == []
