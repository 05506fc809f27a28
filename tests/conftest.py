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


# What else ran on the machine when a lab test failed. A lab test measures CPU shares and
# links, so a process left by earlier tests (or another job) that takes a CPU is enough to
# fail it; each failure gets a line naming the load and the busiest processes, printed in
# the failure and again at the end of the session (where a CI log's tail shows it).
_MACHINE_NOTES: list[str] = []
_PIDS_AT_START: set[int] = set()  # the processes there when the session began


def machine_note(sample_s: float = 1.0) -> str:
    """The load average and the processes that used the most CPU over ``sample_s``
    (its command line's start, pid, share of a core, and whether it was there before this
    test session began)."""
    import time

    import psutil

    procs = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            p.cpu_percent(None)
            procs.append(p)
        except psutil.Error:
            pass
    time.sleep(sample_s)
    busy = []
    for p in procs:
        try:
            pct = p.cpu_percent(None)
        except psutil.Error:
            continue
        if pct >= 5.0 and p.pid != os.getpid():
            what = " ".join(" ".join(p.info["cmdline"] or [p.info["name"] or "?"]).split())[:70]
            old = " (before the session)" if p.pid in _PIDS_AT_START else ""
            busy.append((pct, f"{pct:.0f}% pid {p.pid}{old}: {what}"))
    busy.sort(reverse=True)
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    return f"load {load}; busiest: {'; '.join(b for _, b in busy[:5]) or 'none over 5%'}"


def pytest_sessionstart(session):
    import psutil

    _PIDS_AT_START.update(psutil.pids())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and "lab" in item.keywords:
        try:
            note = machine_note()
        except Exception as exc:  # the note is a diagnosis, never a second failure
            note = f"(machine note failed: {exc})"
        report.sections.append(("machine when it failed", note))
        _MACHINE_NOTES.append(f"{item.name} ({report.when}): {note}")


def pytest_terminal_summary(terminalreporter):
    if _MACHINE_NOTES:
        terminalreporter.section("machine when lab tests failed")
        for line in _MACHINE_NOTES:
            terminalreporter.write_line(line)
