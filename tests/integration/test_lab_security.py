"""The lab is safe to run as root: sshd's keys are root's, down trusts no forged state,
files written under sudo stay the user's, and only one process shapes the link at a time."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.lab]

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACR_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("TRACR_DEVICES", str(tmp_path / "config" / "devices.yaml"))
    return tmp_path / "config"


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith("tracr-lab-")]


@pytest.fixture
def lab_down_after():
    from app_api import lab

    if _namespaces():
        pytest.skip("a tracr lab is already up on this machine")
    yield lab
    lab.down()
    assert _namespaces() == []


def _ssh(key: str, known_hosts: str, address: str) -> subprocess.CompletedProcess:
    argv = [
        "ssh", "-i", key, "-o", "IdentitiesOnly=yes", "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", f"root@{address}", "id -u",
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def _root_only_path(path: Path) -> list[str]:
    """Why ``path`` or a directory above it could be changed by someone other than root."""
    bad = []
    for p in (path, *path.parents):
        st = os.lstat(p)
        if st.st_uid != 0 or (st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
                              and not st.st_mode & stat.S_ISVTX):
            bad.append(f"{p} uid={st.st_uid} mode={stat.filemode(st.st_mode)}")
    return bad


def test_sshd_is_strict_and_its_keys_are_root_only(cfg, tmp_path, lab_down_after, monkeypatch):
    """StrictModes yes (sshd's own effective config), every file sshd trusts is root's and
    only root's, a key planted in the old user-writable location does not log in, and the
    files written for the user under sudo are the user's."""
    lab = lab_down_after
    monkeypatch.setenv("SUDO_UID", str(NOBODY))  # as if 'sudo -E' was run by nobody
    monkeypatch.setenv("SUDO_GID", str(NOBODY))
    state = lab.up(hosts=1, verify=False, pin=False)
    h = state["hosts"][0]
    config = Path(h["sshd_config"])

    effective = subprocess.run(
        ["ip", "netns", "exec", h["ns"], "/usr/sbin/sshd", "-T", "-f", str(config)],
        capture_output=True, text=True, check=True,
    ).stdout.lower().splitlines()
    assert "strictmodes yes" in effective
    files = {config, Path(h["host_key"])}
    for line in effective:
        key, _, value = line.partition(" ")
        if key in ("hostkey", "authorizedkeysfile"):
            files |= {Path(v) for v in value.split()}
    assert any("authorized" in f.name for f in files)
    for f in files:
        assert f.is_absolute() and not str(f).startswith(str(cfg)), f
        assert _root_only_path(f) == [], f
        assert not os.lstat(f).st_mode & stat.S_IWOTH
    assert stat.S_IMODE(os.lstat(h["host_key"]).st_mode) == 0o600

    # The observer's key works, and it is the invoking user's.
    assert _ssh(state["client_key"], state["known_hosts"], h["address"]).stdout.strip() == "0"
    key = Path(state["client_key"])
    assert (key.stat().st_uid, stat.S_IMODE(key.stat().st_mode)) == (NOBODY, 0o600)
    for mine in (cfg / "devices.yaml", cfg / "known_hosts", cfg / "lab", cfg):
        assert os.lstat(mine).st_uid == NOBODY, mine

    # A local user plants their own key where older versions kept authorized_keys.
    attacker = tmp_path / "attacker"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(attacker)],
                   check=True)
    planted = cfg / "lab" / "authorized_keys"
    planted.write_text((attacker.with_suffix(".pub")).read_text())
    os.chown(planted, NOBODY, NOBODY)
    r = _ssh(str(attacker), state["known_hosts"], h["address"])
    assert r.returncode != 0 and "denied" in r.stderr.lower(), (r.stdout, r.stderr)


def test_forged_state_is_refused_and_nothing_else_is_touched(cfg, tmp_path, lab_down_after):
    """A state.json naming things tracr never creates: down removes only what is provably
    the lab's (a leftover namespace by its name) and says the state was refused."""
    from app_api import lab
    from app_api.devices.registry import Device, DeviceRegistry
    from app_api.lab import state as lab_state

    victim_link = "trvictim0"
    subprocess.run(["ip", "link", "del", victim_link], capture_output=True)
    subprocess.run(["ip", "link", "add", victim_link, "type", "veth", "peer", "name", "trvictim1"],
                   check=True)
    victim_dir = tmp_path / "victim-cgroup"
    victim_dir.mkdir()
    victim_file = tmp_path / "hosts"
    victim_file.write_text("10.213.0.2 ssh-ed25519 AAAAC3Nza\nkeep me\n")
    sleeper = subprocess.Popen(["sleep", "60"])
    reg = DeviceRegistry.load()
    reg.add(Device(name="pi4", host="10.0.0.7", user="pi"))
    reg.save()
    subprocess.run(["ip", "netns", "add", "tracr-lab-7"], check=True)  # a real leftover
    forged = lab_state.new_state()
    forged.update(
        known_hosts=str(victim_file),
        known_hosts_lines=["10.213.0.2 ssh-ed25519 AAAAC3Nza"],
        registry=["pi4"],
        hosts=[{"name": "lab-1", "ns": "../../etc", "veth_host": victim_link,
                "cgroup": str(victim_dir), "sshd_pid": sleeper.pid,
                "dir": "/etc", "address": "10.213.0.2"}],
    )
    try:
        for path in {lab_state.state_path(), cfg / "lab" / "state.json"}:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(forged))
        removed = lab.down()
        assert "tracr-lab-7" in removed["namespaces"]  # what it can prove is still removed
        assert victim_dir.is_dir()
        assert victim_file.read_text() == "10.213.0.2 ssh-ed25519 AAAAC3Nza\nkeep me\n"
        assert sleeper.poll() is None
        assert "pi4" in DeviceRegistry.load()
        links = subprocess.run(["ip", "link", "show", victim_link], capture_output=True)
        assert links.returncode == 0
        assert any("not what 'lab up' writes" in r and "../../etc" in r for r in removed["refused"])
        assert not lab_state.state_path().exists()
    finally:
        sleeper.kill()
        sleeper.wait()
        subprocess.run(["ip", "link", "del", victim_link], capture_output=True)
        subprocess.run(["ip", "netns", "del", "tracr-lab-7"], capture_output=True)


def test_cli_down_says_a_forged_state_was_refused(cfg, lab_down_after, capsys):
    import app
    from app_api.lab import state as lab_state

    path = lab_state.state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    forged = lab_state.new_state()
    forged["hosts"] = [{"name": "lab-1", "cgroup": "/sys/fs/cgroup/system.slice"}]
    path.write_text(json.dumps(forged))
    assert app.main(["lab", "down"]) == 1
    err = capsys.readouterr().err
    assert "refused" in err and "/sys/fs/cgroup/system.slice" in err


_HOLD = """
import sys, time
from app_api.runner.shaping import shaped
with shaped("2MB/s"):
    print("held", flush=True)
    time.sleep(float(sys.argv[1]))
"""


def test_a_second_shaper_waits_or_fails_clearly(cfg, lab_down_after):
    """While a shaped run holds the link, 'tracr lab shape' elsewhere does not re-shape it:
    it waits (bounded) and fails naming the holder; a patient shaper goes after it."""
    lab = lab_down_after
    state = lab.up(hosts=2, bandwidth="4MB/s", verify=False, pin=False)
    h = state["hosts"][0]
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def qdisc() -> str:
        return subprocess.run(["ip", "netns", "exec", h["ns"], "tc", "qdisc", "show", "dev",
                               h["veth_ns"]], capture_output=True, text=True).stdout

    def hold(seconds: float) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", _HOLD, str(seconds)], stdout=subprocess.PIPE,
                             text=True, env=env, cwd=REPO)
        assert p.stdout.readline().strip() == "held"
        return p

    holder = hold(120)  # a shaped run at 2MB/s
    try:
        assert "16Mbit" in qdisc()
        other = subprocess.run([sys.executable, "app.py", "lab", "shape", "--bandwidth", "1MB/s",
                                "--no-verify"], capture_output=True, text=True, env=env,
                               cwd=REPO, timeout=60)
        assert "16Mbit" in qdisc()  # the running experiment's link was left alone
        assert other.returncode == 1, other.stdout + other.stderr
        assert f"pid {holder.pid}" in other.stderr and "in use" in other.stderr
    finally:
        holder.kill()  # the kernel drops the lock of a killed holder
        holder.wait()
        holder.stdout.close()
    holder = hold(2)
    try:
        t0 = time.monotonic()
        lab.shape("1MB/s", verify=False, wait_s=30)  # waits for the holder, then shapes
        assert time.monotonic() - t0 > 0.5
        assert holder.wait(timeout=30) == 0
        assert "8Mbit" in qdisc()
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
        holder.stdout.close()


def test_down_removes_an_older_versions_files_by_name_only(cfg, tmp_path, lab_down_after):
    """The user's lab dir from an older tracr: its keys, configs and state go; what else is
    there, and whatever a planted link points to, stays."""
    lab = lab_down_after
    old = cfg / "lab"
    (old / "lab-1").mkdir(parents=True)
    for name in ("authorized_keys", "state.json", "id_ed25519", "id_ed25519.pub"):
        (old / name).write_text("{}" if name == "state.json" else "x\n")
    for name in ("ssh_host_ed25519_key", "sshd_config", "sshd.log"):
        (old / "lab-1" / name).write_text("x\n")
    (old / "notes.txt").write_text("mine\n")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "sshd_config").write_text("keep\n")
    (old / "lab-2").symlink_to(victim)
    removed = lab.down()
    assert sorted(p.name for p in old.iterdir()) == ["lab-2", "notes.txt"]
    assert (victim / "sshd_config").read_text() == "keep\n"
    assert any("older tracr" in r for r in removed["refused"])
