"""The lab link lock: exclusive across processes, re-entrant within one, bounded waits."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app_api.lab import lock, state

REPO = Path(__file__).resolve().parents[2]
_HOLD = """
import sys, time
from pathlib import Path
from app_api.lab import lock, state
state.LAB_ROOT = Path(sys.argv[1])
with lock.link_lock():
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setattr(state, "LAB_ROOT", tmp_path / "lab")
    (tmp_path / "lab").mkdir()
    return tmp_path / "lab"


def _hold(root: Path, seconds: float) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", _HOLD, str(root), str(seconds)],
                         stdout=subprocess.PIPE, text=True, cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.stdout.readline().strip() == "held"
    return p


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait()
    p.stdout.close()


def test_a_second_process_fails_naming_the_holder(root):
    holder = _hold(root, 30)
    try:
        t0 = time.monotonic()
        with pytest.raises(lock.LabBusyError) as err, lock.link_lock(wait_s=0.3):
            pass
        assert time.monotonic() - t0 < 5
        assert f"pid {holder.pid}" in err.value.message and err.value.exit_code == 1
    finally:
        _stop(holder)
    with lock.link_lock(wait_s=5):  # the kernel dropped the killed holder's lock
        pass


def test_a_second_process_waits_for_the_holder(root):
    holder = _hold(root, 1.0)
    try:
        t0 = time.monotonic()
        with lock.link_lock(wait_s=30):
            waited = time.monotonic() - t0
        assert waited > 0.5  # we got in only after the holder's second had passed
    finally:
        _stop(holder)


def test_reentrant_in_one_thread_exclusive_between_threads(root):
    got = []
    with lock.link_lock(wait_s=1):
        with lock.link_lock(wait_s=1):  # lab.shape() inside a shaped run
            t = threading.Thread(target=lambda: got.append(_try(0.2)))
            t.start()
            t.join()
    assert got == ["busy"]
    assert _try(0.2) == "ok"


def _try(wait: float) -> str:
    try:
        with lock.link_lock(wait_s=wait):
            return "ok"
    except lock.LabBusyError:
        return "busy"


def test_no_lab_no_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(state, "LAB_ROOT", tmp_path / "absent")
    with lock.link_lock(wait_s=0):
        pass
    assert not (tmp_path / "absent").exists()
