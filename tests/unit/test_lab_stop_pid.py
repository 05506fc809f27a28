"""`stop_pid` stops a process the lab started and, when it is our child, reaps it: a real
child process, signals and /proc, no lab."""

from __future__ import annotations

import subprocess
import time

from app_api.lab import system


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_a_child_that_exits_between_the_reap_and_the_check_is_reaped(monkeypatch):
    # Regression: stop_pid reaped, then checked: a child that exited between the two was
    # a zombie, which the check counts as stopped, and nothing reaped it. lab down left a
    # host's sshd so, a zombie of the process that brought the lab up (a test's), and
    # `kill -0` on it still succeeded (test_alexnet_sweep_on_the_lab, after the emulator
    # tests, under load). Here the first reap comes just before the child is gone.
    child = subprocess.Popen(["sleep", "30"])
    real, calls = system._reap, []

    def late_reap(pid):
        calls.append(pid)
        if len(calls) == 1:  # the reap ran first; the child exits right after it
            deadline = time.monotonic() + 5
            while _state(pid) != "Z" and time.monotonic() < deadline:
                time.sleep(0.01)
            return
        real(pid)

    monkeypatch.setattr(system, "_reap", late_reap)
    try:
        assert system.stop_pid(child.pid)
        assert _state(child.pid) is None, "left a zombie"
    finally:
        if _state(child.pid) is not None:
            child.kill()
        child.returncode = 0  # reaped by stop_pid: Popen must not wait for it again


def test_a_child_is_stopped_and_reaped():
    child = subprocess.Popen(["sleep", "30"])
    assert system.stop_pid(child.pid)
    assert _state(child.pid) is None
    child.returncode = 0
    assert not system.stop_pid(child.pid)  # gone: nothing to stop
