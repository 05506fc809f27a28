"""Under ``sudo -E`` the files tracr writes for the user stay the user's (no root-owned
devices.yaml or known_hosts breaking their next command), and a root-owned file left by
an older version is a clear message, not a PermissionError traceback."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to be another user)")
NOBODY = 65534


@pytest.fixture
def sudo_cfg(monkeypatch):
    """A config dir below a world-readable temp dir, and 'sudo' run by nobody."""
    top = Path(tempfile.mkdtemp(prefix="tracr-own-"))
    top.chmod(0o755)
    cfg = top / "config"
    monkeypatch.setenv("TRACR_CONFIG_DIR", str(cfg))
    monkeypatch.setenv("TRACR_DEVICES", str(cfg / "devices.yaml"))
    monkeypatch.setenv("SUDO_UID", str(NOBODY))
    monkeypatch.setenv("SUDO_GID", str(NOBODY))
    yield cfg
    shutil.rmtree(top)


@contextlib.contextmanager
def as_nobody():
    os.setegid(NOBODY)
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def _owner(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid


def test_registry_and_known_hosts_written_under_sudo_are_the_users(sudo_cfg):
    from app_api.devices.registry import Device, DeviceRegistry
    from app_api.lab import sshd

    reg = DeviceRegistry.load()
    reg.add(Device(name="pi4", host="10.0.0.7", user="pi"))
    reg.save()
    sshd.add_known_hosts(sudo_cfg / "known_hosts", ["10.213.0.2 ssh-ed25519 AAAAC3Nza"])
    for path in (sudo_cfg, sudo_cfg / "devices.yaml", sudo_cfg / "known_hosts"):
        assert _owner(path) == (NOBODY, NOBODY), path
    # and the user, without sudo, goes on using them
    with as_nobody():
        reg = DeviceRegistry.load()
        reg.remove("pi4")
        reg.save()
        assert sshd.remove_known_hosts(sudo_cfg / "known_hosts", {"10.213.0.2"}) == 1


def test_a_root_owned_registry_is_a_clear_error(sudo_cfg, monkeypatch, capsys):
    """What an older tracr left under sudo: the user's next command says what to do."""
    import app
    from app_api.devices.registry import DeviceRegistry

    monkeypatch.delenv("SUDO_UID")  # the older version: everything root's
    assert app.main(["device", "ls"]) == 0  # imports done as root (nobody cannot read /root)
    capsys.readouterr()
    sudo_cfg.mkdir(mode=0o755)
    (sudo_cfg / "devices.yaml").write_text("devices: {}\n")
    (sudo_cfg / "devices.yaml").chmod(0o600)
    with as_nobody():
        with pytest.raises(Exception) as err:
            DeviceRegistry.load()
        assert type(err.value).__name__ == "TracrError"
        assert "chown" in err.value.hint
        assert app.main(["device", "ls"]) == 2
    out = capsys.readouterr().err
    assert "devices.yaml" in out and "owned by root" in out and "Traceback" not in out
