"""Device registry: load/save/rm, path overrides, the built-in localhost, field validation."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from app_api.devices.registry import (
    Device,
    DeviceRegistry,
    config_dir,
    known_hosts_path,
    registry_path,
)
from experiment_design.errors import TracrError, UnknownNameError


def _dev(**kw) -> Device:
    base = dict(name="pi4", host="10.0.0.7", user="pi", port=2222, key="~/.ssh/id_ed25519",
                python="/usr/bin/python3", tags=["arm"], description="bench Pi")  # fmt: skip
    base.update(kw)
    return Device(**base)


def test_save_load_remove_roundtrip(tmp_path):
    path = tmp_path / "sub" / "devices.yaml"
    reg = DeviceRegistry(path)
    reg.add(_dev())
    reg.add(_dev(name="jetson", host="jetson.lan", data_host="192.168.1.9", port=22))
    reg.save()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    back = DeviceRegistry.load(path)
    assert back.names() == ["localhost", "jetson", "pi4"]
    pi = back.get("pi4")
    assert (pi.host, pi.port, pi.user, pi.tags, pi.python) == (
        "10.0.0.7",
        2222,
        "pi",
        ["arm"],
        "/usr/bin/python3",
    )
    assert back.get("jetson").address == "192.168.1.9"
    assert pi.address == "10.0.0.7"  # data_host defaults to host
    back.remove("pi4")
    back.save()
    assert DeviceRegistry.load(path).names() == ["localhost", "jetson"]


def test_missing_file_is_empty_registry(tmp_path):
    reg = DeviceRegistry.load(tmp_path / "nope.yaml")
    assert reg.names() == ["localhost"]


def test_localhost_is_builtin_never_stored_not_removable(tmp_path):
    path = tmp_path / "d.yaml"
    reg = DeviceRegistry(path)
    local = reg.get("localhost")
    assert local.builtin and local.python == sys.executable
    assert "localhost" in reg
    with pytest.raises(TracrError, match="built in"):
        reg.remove("localhost")
    with pytest.raises(TracrError, match="built in"):
        reg.add(_dev(name="localhost"))
    reg.add(_dev())
    reg.save()
    assert "localhost" not in path.read_text()


def test_unknown_device_lists_valid_names(tmp_path):
    reg = DeviceRegistry(tmp_path / "d.yaml")
    reg.add(_dev())
    with pytest.raises(UnknownNameError) as info:
        reg.get("pi5")
    assert "Did you mean 'pi4'" in info.value.message
    assert "localhost" in info.value.message


def test_env_overrides(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACR_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.delenv("TRACR_DEVICES")
    assert registry_path() == tmp_path / "cfg" / "devices.yaml"
    assert known_hosts_path() == tmp_path / "cfg" / "known_hosts"
    monkeypatch.setenv("TRACR_DEVICES", str(tmp_path / "other.yaml"))
    assert registry_path() == tmp_path / "other.yaml"
    assert DeviceRegistry.load().path == tmp_path / "other.yaml"
    monkeypatch.delenv("TRACR_CONFIG_DIR")
    assert config_dir() == config_dir().home() / ".config" / "tracr"


def test_default_location_is_outside_the_repo(monkeypatch):
    monkeypatch.delenv("TRACR_DEVICES")
    monkeypatch.delenv("TRACR_CONFIG_DIR")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert not str(registry_path()).startswith(repo)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("name", "bad name", "Invalid device name"),
        ("name", "", "Invalid device name"),
        ("host", "a b", "invalid host"),
        ("user", "", "invalid user"),
        ("port", 0, "port must be"),
        ("port", 70000, "port must be"),
        ("port", "22", "port must be"),
        ("python", " ", "python must"),
        ("tags", "arm", "tags must"),
        ("data_host", "x y", "invalid data_host"),
    ],
)
def test_validation(field, value, match):
    with pytest.raises(TracrError, match=match):
        _dev(**{field: value}).validate()


def test_bad_files_are_clear_errors(tmp_path):
    p = tmp_path / "d.yaml"
    p.write_text("devices:\n  pi4: {host: h, user: u, colour: red}\n")
    with pytest.raises(TracrError, match="unknown field"):
        DeviceRegistry.load(p)
    p.write_text("devices:\n  pi4: {user: u}\n")
    with pytest.raises(TracrError, match="missing field"):
        DeviceRegistry.load(p)
    p.write_text("devices: [1, 2]\n")
    with pytest.raises(TracrError, match="devices"):
        DeviceRegistry.load(p)
    p.write_text("devices: {a: [\n")
    with pytest.raises(TracrError, match="not valid YAML"):
        DeviceRegistry.load(p)


def test_cli_devices_option_exports_env(tmp_path, monkeypatch):
    from app import main

    target = tmp_path / "mine.yaml"
    reg = DeviceRegistry(target)
    reg.add(_dev())
    reg.save()
    assert main(["device", "--devices", str(target), "ls", "--json"]) == 0
    assert os.environ["TRACR_DEVICES"] == str(target)


def test_cli_ls_json_and_rm(tmp_path, monkeypatch, capsys):
    import json

    from app import main

    target = tmp_path / "d.yaml"
    monkeypatch.setenv("TRACR_DEVICES", str(target))
    reg = DeviceRegistry(target)
    reg.add(_dev(last_check={"status": "unreachable", "error": "no TCP connection"}))
    reg.save()
    assert main(["device", "ls", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["localhost", "pi4"]
    assert rows[1]["status"] == "unreachable"
    assert main(["device", "rm", "pi4"]) == 0
    assert DeviceRegistry.load(target).names() == ["localhost"]
    assert main(["device", "rm", "localhost"]) == 2
    assert main(["device", "rm", "ghost"]) == 2
