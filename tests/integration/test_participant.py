"""The participant process exits by itself when its observer goes away, and cleans up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from app_api.launch import LocalLauncher, ParticipantSpec
from experiment_design.protocol import ALIVE_LINE
from experiment_design.runtime import connect_control

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def wait_exit(proc, timeout=20.0) -> int:
    return proc.wait(timeout=timeout)


@pytest.mark.parametrize("startup_delay", [0, 3])
def test_idle_timeout_exits_and_removes_workdir(startup_delay):
    # a start-up longer than the idle limit (a loaded host importing torch) does not count:
    # an observer that drives by calls only is idle only once the participant is ready
    work = tempfile.mkdtemp(prefix="tracr-test-idle-")
    secret = os.urandom(32)
    proc = subprocess.Popen(
        [sys.executable, "-m", "experiment_design.participant", "--role", "cloud",
         "--workdir", work, "--cleanup-workdir", "--idle-timeout", "2",
         "--startup-delay", str(startup_delay)],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        proc.stdin.write(secret.hex().encode() + b"\n")
        proc.stdin.flush()
        line = proc.stdout.readline().decode()
        while line.strip() == ALIVE_LINE:  # heartbeats flow from the start
            line = proc.stdout.readline().decode()
        assert line.startswith("TRACR-READY ")
        ready = json.loads(line.split(" ", 1)[1])
        assert ready["pid"] == proc.pid and ready["port"] > 0
        conn = connect_control("127.0.0.1", ready["port"], secret)
        assert json.loads(conn.root.hello())["role"] == "cloud"
        t0 = time.monotonic()
        # connection open, stdin open, but no calls: the watchdog ends it
        assert wait_exit(proc) == 0
        assert time.monotonic() - t0 < 15
        assert not os.path.exists(work)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdin.close()
        proc.stdout.close()


@pytest.mark.parametrize("how", ["stdin", "connection"])
def test_observer_gone_ends_participant(how):
    h = LocalLauncher().start(ParticipantSpec("edge-1", "edge", "localhost", 1, os.urandom(32)))
    try:
        assert h.alive()
        if how == "stdin":
            h.proc.stdin.close()  # what happens when ssh or the observer dies
        else:
            h.conn.close()
        assert wait_exit(h.proc) == 0
        assert h.leftovers() == []
    finally:
        h.stop()
    assert h.leftovers() == []


def test_a_heartbeat_held_up_by_the_main_thread_shows_what_held_it():
    # The heartbeat is a thread, so a main thread that holds the interpreter lock (a long
    # C call that keeps it; here libc's usleep called through ctypes.PyDLL, which keeps
    # it) silences it, and the observer calls the participant lost with no clue why.
    # After STALL_DUMP_S without a beat, every thread's stack goes to stderr.
    code = """
import ctypes, sys, threading, time
import experiment_design.participant as p
p.HEARTBEAT_S, p.STALL_DUMP_S = 0.1, 0.5
threading.Thread(target=p._heartbeat, daemon=True).start()
time.sleep(0.3)
def hold_the_lock(depth):  # deep, so that the dump is longer than a short stderr tail
    return hold_the_lock(depth - 1) if depth else ctypes.PyDLL(None).usleep(1_500_000)
hold_the_lock(60)
time.sleep(0.5)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(ALIVE_LINE) >= 4  # it beat before and after
    err = out.stderr
    assert "Timeout (0:00:00.500000)!" in err, err
    assert "hold_the_lock" in err  # the main thread's stack, where it held the lock
    assert "participant: the heartbeat did not run for" in err

    # a run that loses the participant keeps the whole dump in its errors, not a tail that
    # ends inside it (40 lines kept only the last threads' stacks)
    from app_api.runner.client import lost_hint

    class Handle:  # what lost_hint reads of a participant's handle
        def stderr_tail(self, n: int) -> str:
            return "\n".join(err.splitlines()[-n:])

    hint = lost_hint(Handle())
    assert "Timeout (0:00:00.500000)!" in hint and "hold_the_lock" in hint
    assert len(hint.splitlines()) > 60
