"""The launch package without processes: the one factory, the handle as an owner, the bootstrap's module."""

from __future__ import annotations

import base64
import contextlib
import json

import pytest

from app_api.devices.registry import Device, localhost_device
from app_api.launch import (
    LocalLauncher,
    ParticipantHandle,
    SSHLauncher,
    launcher_for,
)
from app_api.launch.bundle import bootstrap_command
from experiment_design.errors import TracrError
from experiment_design.protocol import PARTICIPANT_MODULE


class FakeHandle(ParticipantHandle):
    """Records its stops; a participant that is never a process."""

    def __init__(self, instance: str, log: list[str]) -> None:
        self.instance, self.device, self.host_label = instance, "localhost", "localhost"
        self.conn, self.data_host = None, "127.0.0.1"
        self._log = log
        self._stopped = False

    def alive(self) -> bool:
        return not self._stopped

    def stop(self, timeout: float = 10.0) -> None:
        if not self._stopped:
            self._stopped = True
            self._log.append(self.instance)

    def leftovers(self) -> list[str]:
        return [] if self._stopped else [f"process of {self.instance}"]


def test_localhost_gets_the_local_launcher_and_a_device_the_ssh_one(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACR_CONFIG_DIR", str(tmp_path))
    assert isinstance(launcher_for("localhost"), LocalLauncher)
    dev = Device(name="pi4", host="10.0.0.7", user="pi", port=2222, key="/keys/id")
    launcher = launcher_for(dev)
    assert isinstance(launcher, SSHLauncher) and launcher.device is dev


def test_an_unknown_device_name_is_a_tracr_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACR_DEVICES", str(tmp_path / "devices.yaml"))
    with pytest.raises(TracrError):
        launcher_for("no-such-device")


def test_the_ssh_launcher_refuses_localhost():
    with pytest.raises(TracrError, match="without SSH"):
        SSHLauncher(localhost_device())


def test_a_handle_is_the_owner_its_with_block_closes():
    log: list[str] = []
    with FakeHandle("edge-1", log) as h:
        assert h.alive() and h.leftovers()
    assert log == ["edge-1"] and h.leftovers() == []
    h.close()  # one exit path, idempotent
    assert log == ["edge-1"]


def test_an_exit_stack_unwinds_every_handle_even_after_an_error():
    log: list[str] = []
    with pytest.raises(RuntimeError), contextlib.ExitStack() as stack:
        for name in ("cloud-1", "edge-1"):
            stack.enter_context(FakeHandle(name, log))
        raise RuntimeError("deploy failed half way")
    assert log == ["edge-1", "cloud-1"]


def test_the_bootstrap_starts_the_protocols_participant_module():
    cmd = bootstrap_command("python3", {"need": ["torch"], "args": ["--role", "cloud"]})
    config = json.loads(base64.b64decode(cmd.rsplit(" ", 1)[1]))
    assert config["module"] == PARTICIPANT_MODULE and config["args"] == ["--role", "cloud"]
    plain = bootstrap_command("python3", {"need": ["torch"]})  # no participant: no module
    assert "module" not in json.loads(base64.b64decode(plain.rsplit(" ", 1)[1]))
