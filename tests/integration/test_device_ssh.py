"""Devices against a real sshd on 127.0.0.1: pair, check, host keys, zero-deploy, self-destruct."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from app_api.devices import ssh
from app_api.devices.pairing import PairRequest, pair
from app_api.devices.probe import probe
from app_api.devices.registry import DeviceRegistry
from app_api.launch import ParticipantSpec
from experiment_design.errors import TracrError

pytestmark = [pytest.mark.integration, pytest.mark.ssh]

REPO = Path(__file__).resolve().parents[2]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, path: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid) and not os.path.exists(path):
            return True
        time.sleep(0.2)
    return False


@pytest.fixture(scope="module")
def paired(loopback_sshd, tmp_path_factory):
    """The loopback device paired non-interactively (the key is already authorized)."""
    reg_path = tmp_path_factory.mktemp("reg") / "devices.yaml"
    out: list[str] = []
    dev = pair(
        PairRequest(
            name="loop", host=loopback_sshd.host, port=loopback_sshd.port, user=loopback_sshd.user,
            key=loopback_sshd.key, python=sys.executable, tags=["test"], yes=True, say=out.append,
            accept_new_host_key=True,
        ),
        DeviceRegistry(reg_path),
    )  # fmt: skip
    return SimpleNamespace(dev=dev, out=out, reg_path=reg_path)


def test_pair_noninteractive_key_already_authorized(paired, loopback_sshd):
    out, reg_path, dev = paired.out, paired.reg_path, paired.dev
    assert any("SHA256:" in line for line in out), out  # fingerprint shown
    assert any("key login" in line for line in out)
    assert dev.last_check["status"] == "ok"
    saved = DeviceRegistry.load(reg_path).get("loop")
    assert saved.port == loopback_sshd.port and saved.tags == ["test"]
    assert saved.last_check["torch"]
    # the host key went into tracr's own known_hosts, not the user's
    assert ssh.recorded_host_keys(saved)
    assert str(saved.known_hosts_file()).startswith(os.environ["TRACR_CONFIG_DIR"])


def test_pair_probes_the_environment(paired):
    import platform
    from importlib.metadata import version

    result = paired.dev.last_check
    assert result["status"] == "ok", result
    assert result["python"] == platform.python_version()
    assert result["torch"].split("+")[0] == version("torch").split("+")[0]
    assert result["accelerator"] in ("cuda", "mps", "cpu") and result["device_name"]
    assert result["cores"] >= 1 and result["memory_bytes"] > 0
    assert result["arch"] == platform.machine() and result["cpu"]


def test_cli_check_statuses(loopback_sshd, tmp_path, monkeypatch, capsys):
    from app import main

    bad_key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(bad_key)], check=True)
    reg = DeviceRegistry(tmp_path / "devices.yaml")
    reg.add(loopback_sshd.device("closed", port=1))
    reg.add(loopback_sshd.device("nopy", python="/nonexistent/python3"))
    reg.add(loopback_sshd.device("badkey", key=str(bad_key)))
    reg.save()
    code = main(
        ["device", "--devices", str(reg.path), "check", "closed", "nopy", "badkey", "--json"]
    )
    assert code == 1
    got = {name: r["status"] for name, r in json.loads(capsys.readouterr().out).items()}
    assert got == {"closed": "unreachable", "nopy": "no python", "badkey": "login failed"}
    # statuses persist for `tracr device ls`
    assert DeviceRegistry.load(reg.path).get("badkey").last_check["status"] == "login failed"


def test_changed_host_key_is_refused(loopback_sshd, tmp_path):
    other = tmp_path / "fake_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kh = tmp_path / "known_hosts"
    algo, blob = other.with_suffix(".pub").read_text().split()[:2]
    kh.write_text(f"[{loopback_sshd.host}]:{loopback_sshd.port} {algo} {blob}\n")
    dev = loopback_sshd.device(name="moved", known_hosts=str(kh))
    assert probe(dev)["status"] == "host key changed"
    with pytest.raises(TracrError, match=r"host key for moved changed.*--rekey"):
        ssh.run_ssh(dev, "true")
    reg = DeviceRegistry(tmp_path / "devices.yaml")
    reg.add(dev)
    req = PairRequest(name="moved", yes=True, say=lambda s: None)
    with pytest.raises(TracrError, match="host key for moved changed"):
        pair(req, reg)
    req.rekey = True
    assert pair(req, reg).last_check["status"] == "ok"


def _spec(role: str = "cloud") -> ParticipantSpec:
    return ParticipantSpec(instance=f"{role}-1", role=role, device="loop", threads=1,
                           secret=secrets.token_bytes(32))  # fmt: skip


def test_deploy_hello_stop_leaves_nothing(loopback_sshd):
    from app_api.launch import SSHLauncher

    handle = SSHLauncher(loopback_sshd.device()).start(_spec())
    try:
        assert handle.alive()
        env = json.loads(handle.conn.root.hello())
        assert env  # the participant answers over the tunnel
        # the temp venv reuses the device's torch instead of installing one
        venv_py = handle.env["python"]
        assert venv_py.startswith(handle.workdir) and os.path.exists(venv_py)
        code = "import importlib.util as u; print(u.find_spec('torch').origin, u.find_spec('rpyc').origin)"
        cp = subprocess.run([venv_py, "-c", code], capture_output=True, text=True, check=True)
        torch_file, rpyc_file = cp.stdout.split()
        import torch

        assert torch_file == torch.__file__
        assert rpyc_file.startswith(handle.workdir)  # shipped rpyc wins
        assert os.path.isdir(Path(handle.workdir) / "experiment_design")
        assert handle.leftovers()  # running: the process and dir are listed
    finally:
        handle.stop()
    handle.stop()  # idempotent
    assert handle.leftovers() == []
    assert not handle.alive()


def test_killed_participant_leaves_no_dir(loopback_sshd):
    from app_api.launch import SSHLauncher

    handle = SSHLauncher(loopback_sshd.device()).start(_spec("edge"))
    os.kill(handle.pid, signal.SIGKILL)  # loopback: the remote python is a local process
    assert _wait_gone(handle.pid, handle.workdir, 15)  # the sh wrapper removed the dir
    deadline = time.monotonic() + 10
    while handle.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    # it died; its ssh session did not lose the device
    assert handle.ended() == f"died (pid {handle.pid})"
    handle.stop()
    assert handle.leftovers() == []


def test_killed_observer_participant_self_destructs(loopback_sshd, tmp_path):
    script = tmp_path / "observer.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, secrets, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from app_api.devices.registry import Device
        from app_api.launch import SSHLauncher
        from app_api.launch import ParticipantSpec
        dev = Device(**json.loads(sys.argv[1]))
        h = SSHLauncher(dev).start(ParticipantSpec("cloud-1", "cloud", dev.name, 1, secrets.token_bytes(32)))
        print(json.dumps({{"pid": h.pid, "workdir": h.workdir}}), flush=True)
        time.sleep(300)
    """)
    )
    d = loopback_sshd.device()
    fields = {
        k: getattr(d, k) for k in ("name", "host", "port", "user", "key", "python", "known_hosts")
    }
    proc = subprocess.Popen([sys.executable, str(script), json.dumps(fields)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        info = json.loads(line)
        assert _pid_alive(info["pid"]) and os.path.isdir(info["workdir"])
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert _wait_gone(info["pid"], info["workdir"], 30), (
        "participant or temp dir survived its observer"
    )


def test_pair_unauthorized_key_without_password_prints_copy_id(loopback_sshd, tmp_path):
    key = tmp_path / "keys" / "id_ed25519"
    req = PairRequest(
        name="newbox", host=loopback_sshd.host, port=loopback_sshd.port, user=loopback_sshd.user,
        key=str(key), python=sys.executable, yes=True, say=lambda s: None,
        accept_new_host_key=True,
    )  # fmt: skip
    reg = DeviceRegistry(tmp_path / "devices.yaml")
    with pytest.raises(TracrError) as info:
        pair(req, reg)
    assert key.exists() and key.with_suffix(".pub").exists()  # created after --yes
    assert f"ssh-copy-id -i {key}.pub -p {loopback_sshd.port}" in info.value.hint
    assert "newbox" not in DeviceRegistry.load(reg.path)  # nothing saved
    req.yes = False
    req.key = str(tmp_path / "absent")
    with pytest.raises(TracrError, match="no SSH key"):  # asks first; non-interactive => error
        pair(req, reg)


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="needs a python without torch")
def test_device_without_torch_is_a_clear_error_and_leaves_nothing(loopback_sshd):
    from app_api.launch import SSHLauncher

    cp = subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True)
    if cp.returncode == 0:
        pytest.skip("/usr/bin/python3 has torch")
    before = set(os.listdir(loopback_sshd.tmp))  # the sshd's sessions make temp dirs here
    with pytest.raises(TracrError, match="has no torch") as info:
        SSHLauncher(loopback_sshd.device(python="/usr/bin/python3")).start(_spec())
    assert "pip install torch" in info.value.hint
    assert set(os.listdir(loopback_sshd.tmp)) - before == set()  # its temp dir was removed


def test_deploy_refuses_changed_host_key(loopback_sshd, tmp_path):
    from app_api.launch import SSHLauncher

    other = tmp_path / "fake_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    algo, blob = other.with_suffix(".pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{loopback_sshd.host}]:{loopback_sshd.port} {algo} {blob}\n")
    with pytest.raises(TracrError, match="host key for moved changed"):
        SSHLauncher(loopback_sshd.device("moved", known_hosts=str(kh))).start(_spec())
