"""Shared fixtures and the skip rules for SSH, lab, soak and long tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _sshd_path() -> str | None:
    for cand in ("/usr/sbin/sshd", shutil.which("sshd") or ""):
        if cand and os.path.exists(cand):
            return cand
    return None


def _netns_ok() -> bool:
    if sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("ip"):
        return False
    probe = f"tracr-probe-ns-{os.getpid()}"  # test processes may probe at once
    ok = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ok


def pytest_collection_modifyitems(config, items):
    need_ssh = any("ssh" in item.keywords or "lab" in item.keywords for item in items)
    sshd = _sshd_path() if need_ssh else None
    netns = _netns_ok() if any("lab" in item.keywords for item in items) else False
    expr = config.getoption("markexpr") or ""
    soak = "soak" in expr or bool(os.environ.get("TRACR_SOAK"))
    long = "long" in expr or bool(os.environ.get("TRACR_LONG"))
    for item in items:
        if "soak" in item.keywords and not soak:
            item.add_marker(pytest.mark.skip(reason="soak test: run with -m soak or TRACR_SOAK=1"))
        if "long" in item.keywords and not long:
            item.add_marker(pytest.mark.skip(reason="long lab study: run with -m long or TRACR_LONG=1"))
        if "ssh" in item.keywords and not sshd:
            item.add_marker(pytest.mark.skip(reason="no sshd (apt-get install openssh-server)"))
        if "lab" in item.keywords and not (netns and sshd):
            item.add_marker(
                pytest.mark.skip(reason="lab tests need root, network namespaces and sshd")
            )


def pytest_configure(config):
    """Keep the whole session away from the user's real device registry and results."""
    import tempfile

    cfg = Path(tempfile.mkdtemp(prefix="tracr-test-config-"))
    config._tracr_config_dir = cfg
    os.environ["TRACR_CONFIG_DIR"] = str(cfg)
    os.environ["TRACR_DEVICES"] = str(cfg / "devices.yaml")
    os.environ["TRACR_RESULTS_DIR"] = str(cfg / "results")


def pytest_unconfigure(config):
    cfg = getattr(config, "_tracr_config_dir", None)
    if cfg is not None:
        shutil.rmtree(cfg, ignore_errors=True)
