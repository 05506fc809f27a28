"""`tracr device ls`: what a device reported is shown as text, never obeyed by the terminal."""

from __future__ import annotations

import unicodedata

from app import main
from app_api.devices.registry import Device, DeviceRegistry


def test_device_ls_escapes_what_the_device_reported(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # one table row per device, nothing wrapped
    reg = DeviceRegistry(tmp_path / "devices.yaml")
    dev = Device(name="pi4", host="10.0.0.7", user="pi", port=22, key="/k")
    # a probe's error carries the device's own stderr
    dev.last_check = {"status": "no python", "error": "\x1b]0;owned\x07sh: [red]x\x1b[2J: not found"}
    reg.add(dev)
    reg.save()
    assert main(["device", "--devices", str(reg.path), "ls"]) == 0
    out = capsys.readouterr().out
    assert not [ch for ch in out if unicodedata.category(ch) == "Cc" and ch not in "\n"], out
    assert "[red]x" in out and "owned" in out  # markup shown, not applied
