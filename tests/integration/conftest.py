"""Integration fixtures: a real sshd on 127.0.0.1 for SSH tests (``loopback_sshd``)."""

from __future__ import annotations

import os

import pytest

SSHD = "/usr/sbin/sshd"


@pytest.fixture(scope="session")
def loopback_sshd():
    """A real sshd on 127.0.0.1:<free port> with its own config, host key and authorized key.

    Yields an ``app_api.devices.loopback.LoopbackSshd`` (host, port, user, key,
    known_hosts, dir, pid, tmp, ``ssh_argv(cmd)``, ``device(name, **fields)``);
    its sessions get ``TMPDIR=tmp``, so deploys through it make their temp dirs
    there and a test can check exactly what was left behind. The
    daemon is stopped by PID and its temp dir removed at the end of the session.
    """
    if not os.path.exists(SSHD):
        pytest.skip(f"no {SSHD} (apt-get install openssh-server)")
    from app_api.devices.loopback import start_loopback_sshd
    from experiment_design.errors import TracrError

    try:
        sshd = start_loopback_sshd(SSHD)
    except TracrError as exc:
        pytest.skip(str(exc))
    try:
        yield sshd
    finally:
        sshd.stop()


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    """A private config dir, device registry and results dir for one test."""
    monkeypatch.setenv("TRACR_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("TRACR_DEVICES", str(tmp_path / "devices.yaml"))
    monkeypatch.setenv("TRACR_RESULTS_DIR", str(tmp_path / "results"))
    return tmp_path
