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


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


def test_device_prepare_and_check_use_the_last_check_of_an_offline_device(tmp_path, capsys,
                                                                        monkeypatch):
    """Offline, prepare and check go by what the device's last check recorded; a cached
    wheel covers what it lacks (no package index is asked for what is cached)."""
    monkeypatch.setenv("TRACR_CONFIG_DIR", str(tmp_path))
    from app_api.devices import wheels

    platform = {"python": "3.11.2", "machine": "aarch64", "libc": "glibc", "libc_version": "2.36"}
    found = {m: True for g in wheels.DEVICE_DEPS.values() for ms in g.values() for m in ms}
    found["idna"] = False  # the device has blosc2 and all else but idna (httpx's)
    found["cryptography"] = False
    reg = DeviceRegistry(tmp_path / "devices.yaml")
    reg.add(Device(name="pi4", host="127.0.0.1", user="pi", port=_closed_port(), key="/k",
                   last_check={"status": "ok", "platform": platform, "modules": found}))
    reg.save()
    assert main(["device", "--devices", str(reg.path), "check", "pi4"]) == 1
    out = capsys.readouterr().out
    assert "pi4: lacks cryptography (python 3.11.2, cp311-manylinux_2_36_aarch64)" in out
    assert "tracr device prepare pi4" in out
    cache = wheels.cache_dir(wheels.DevicePlatform.from_facts(platform))
    cache.mkdir(parents=True)
    (cache / "cryptography-50.0.2-cp311-abi3-manylinux_2_34_aarch64.whl").write_bytes(b"")
    assert main(["device", "--devices", str(reg.path), "prepare", "pi4"]) == 0
    assert "pi4: 1 packages it lacks, all in" in capsys.readouterr().out
    reg = DeviceRegistry.load(reg.path)
    check = reg.get("pi4").last_check
    assert check["status"] == "unreachable" and check["platform"] == platform  # kept
