"""Pairing against a real sshd: a new host key is shown and asked about before anything is sent;
tracr's ssh options survive a config dir whose path has a space (and a ``%``) in it."""

from __future__ import annotations

import os
import pty
import secrets
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app_api.devices import ssh
from app_api.devices.pairing import PairRequest, pair
from app_api.devices.registry import DeviceRegistry, known_hosts_path
from experiment_design.errors import TracrError

pytestmark = [pytest.mark.integration, pytest.mark.ssh]

REPO = Path(__file__).resolve().parents[2]


def _openssh_fingerprint(sshd) -> str:
    """What OpenSSH itself says about the sshd's host key (``ssh-keygen -lf``)."""
    out = subprocess.run(
        ["ssh-keygen", "-lf", os.path.join(sshd.dir, "host_key.pub")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return next(w for w in out.split() if w.startswith("SHA256:"))


def _new_key(where: Path) -> Path:
    """A key pair the sshd does not know: logging in with it needs a password."""
    key = where / "id_new"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


class _Asker:
    """Records the questions pairing asks, answering with ``answer``."""

    def __init__(self, answer: bool):
        self.answer = answer
        self.questions: list[str] = []
        self.passwords: list[str] = []

    def ask(self, question: str) -> bool:
        self.questions.append(question)
        return self.answer

    def ask_password(self, prompt: str) -> str:
        self.passwords.append(prompt)
        return "not-a-real-password"


def test_new_host_key_refused_without_asking_and_no_password_sent(loopback_sshd, cfg):
    # Before: the key was trusted silently and the password went to the host at once
    # (here: "could not install the public key", after a password login was tried).
    said: list[str] = []
    asker = _Asker(True)
    req = PairRequest(
        name="newbox", host=loopback_sshd.host, port=loopback_sshd.port, user=loopback_sshd.user,
        key=str(_new_key(cfg)), python=sys.executable, yes=True, say=said.append,
        password="secret", ask=None, ask_password=asker.ask_password,
    )  # fmt: skip
    reg = DeviceRegistry(cfg / "devices.yaml")
    with pytest.raises(TracrError) as info:
        pair(req, reg)
    fp = _openssh_fingerprint(loopback_sshd)
    assert "not known yet" in info.value.message and fp in info.value.message
    assert "--accept-new-host-key" in info.value.hint
    assert any(fp in line for line in said)  # shown, the way OpenSSH shows it
    assert asker.passwords == []
    assert not known_hosts_path().exists() or not ssh.recorded_host_keys(
        loopback_sshd.device("newbox", known_hosts="")
    )
    assert "newbox" not in DeviceRegistry.load(reg.path)


def test_new_host_key_is_asked_about_before_any_login(loopback_sshd, cfg):
    said: list[str] = []
    no = _Asker(False)
    req = PairRequest(
        name="newbox", host=loopback_sshd.host, port=loopback_sshd.port, user=loopback_sshd.user,
        key=str(_new_key(cfg)), python=sys.executable, yes=True, say=said.append,
        ask=no.ask, ask_password=no.ask_password,
    )  # fmt: skip
    reg = DeviceRegistry(cfg / "devices.yaml")
    with pytest.raises(TracrError, match="host key of newbox .* was not trusted"):
        pair(req, reg)
    fp = _openssh_fingerprint(loopback_sshd)
    assert len(no.questions) == 1 and "Trust this host key" in no.questions[0]
    assert any(fp in line for line in said)  # the fingerprint came before the question
    assert no.passwords == []  # refused: no password asked, none sent
    assert not known_hosts_path().exists()

    # Yes, with the authorized key: recorded, then key login (no password needed).
    said.clear()
    yes = _Asker(True)
    req.ask, req.ask_password, req.key = yes.ask, yes.ask_password, loopback_sshd.key
    dev = pair(req, reg)
    assert len(yes.questions) == 1 and yes.passwords == []
    assert dev.last_check["status"] == "ok"
    assert any(fp in line for line in said)
    assert ssh.recorded_host_keys(dev)
    # Known now: pairing again asks nothing.
    again = _Asker(False)
    req.ask = again.ask
    pair(req, reg)
    assert again.questions == []


def test_cli_pair_refuses_new_host_key_noninteractive_then_accepts_with_flag(
    loopback_sshd, cfg, capsys
):
    from app import main

    argv = [
        "device", "pair", "--name", "loop", "--host", loopback_sshd.host,
        "--port", str(loopback_sshd.port), "--user", loopback_sshd.user,
        "--key", loopback_sshd.key, "--python", sys.executable,
    ]  # fmt: skip
    assert main(argv) == 2  # stdin is not a terminal under pytest: nobody to ask
    err = capsys.readouterr().err
    assert _openssh_fingerprint(loopback_sshd) in err and "--accept-new-host-key" in err
    assert "loop" not in DeviceRegistry.load()
    assert main([*argv, "--accept-new-host-key"]) == 0
    assert DeviceRegistry.load().get("loop").last_check["status"] == "ok"


def _read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError(f"no {needle!r} within {timeout} s; got:\n{buf.decode()}")
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            chunk = b""
        if not chunk:
            raise AssertionError(f"terminal closed before {needle!r}; got:\n{buf.decode()}")
        buf += chunk
    return buf


@pytest.mark.parametrize("answer", ["n", "y"])
def test_cli_pair_in_a_terminal_asks_about_the_host_key(loopback_sshd, cfg, answer):
    """The real prompt on a real terminal: fingerprint first, then the question."""
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "app.py"), "device", "pair", "--name", "loop",
         "--host", loopback_sshd.host, "--port", str(loopback_sshd.port),
         "--user", loopback_sshd.user, "--key", loopback_sshd.key, "--python", sys.executable],
        stdin=slave, stdout=slave, stderr=slave, env=env, cwd=REPO, start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    try:
        shown = _read_until(master, b"Trust this host key", 60)
        assert _openssh_fingerprint(loopback_sshd).encode() in shown
        os.write(master, f"{answer}\n".encode())
        rest = b""
        while True:
            if not select.select([master], [], [], 60)[0]:
                break
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            rest += chunk
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    if answer == "n":
        assert rc == 2 and b"was not trusted" in rest, rest
        assert "loop" not in DeviceRegistry.load()
    else:
        assert rc == 0 and b"paired loop" in rest, rest
        assert DeviceRegistry.load().get("loop").last_check["status"] == "ok"


def test_config_dir_with_a_space_pairs_checks_and_deploys(loopback_sshd, tmp_path, monkeypatch):
    # Before: `-o UserKnownHostsFile=<dir with a space>/known_hosts` named two files, no
    # host key was found, and every connection failed ("no recorded host key").
    from app import main
    from app_api.launch import ParticipantSpec, SSHLauncher

    cfg = tmp_path / "tracr config %h #1"  # a space, and what ssh would expand or cut
    cfg.mkdir()
    monkeypatch.setenv("TRACR_CONFIG_DIR", str(cfg))
    monkeypatch.setenv("TRACR_DEVICES", str(cfg / "devices.yaml"))
    monkeypatch.setenv("TRACR_RESULTS_DIR", str(cfg / "results"))
    key = cfg / "id_ed25519"  # the key lives there too: -i / IdentityFile gets the same path
    shutil.copy(loopback_sshd.key, key)
    shutil.copy(loopback_sshd.key + ".pub", str(key) + ".pub")
    os.chmod(key, 0o600)

    assert main([
        "device", "pair", "--name", "spaced", "--host", loopback_sshd.host,
        "--port", str(loopback_sshd.port), "--user", loopback_sshd.user, "--key", str(key),
        "--python", sys.executable, "--accept-new-host-key",
    ]) == 0  # fmt: skip
    dev = DeviceRegistry.load().get("spaced")
    assert dev.known_hosts_file() == cfg / "known_hosts" and ssh.recorded_host_keys(dev)
    assert main(["device", "check", "spaced", "--json"]) == 0

    spec = ParticipantSpec(instance="cloud-1", role="cloud", device="spaced", threads=1,
                           secret=secrets.token_bytes(32))  # fmt: skip
    handle = SSHLauncher(dev).start(spec)
    try:
        assert handle.alive() and handle.conn.root.hello()
    finally:
        handle.stop()
    assert handle.leftovers() == []
