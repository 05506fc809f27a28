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
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
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
        # and says why where the observer reads it (a run showed only "connection closed
        # by peer" for a participant that ended itself)
        err = proc.stderr.read().decode()
        assert "participant exiting: no heartbeat or call from the observer for 2 s" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdin.close()
        proc.stdout.close()
        proc.stderr.close()


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
    # A heartbeat thread (where the helper cannot run) needs the interpreter lock, so a
    # main thread that holds it (a long C call that keeps it; here libc's usleep called
    # through ctypes.PyDLL, which keeps it) silences it. After STALL_DUMP_S without a
    # beat, every thread's stack goes to stderr.
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
    assert "participant: the interpreter was held for" in err and "no heartbeat" in err

    # a run that loses the participant keeps the whole dump in its errors, not a tail that
    # ends inside it (40 lines kept only the last threads' stacks)
    from app_api.runner.client import lost_hint

    class Handle:  # what lost_hint reads of a participant's handle
        def stderr_tail(self, n: int) -> str:
            return "\n".join(err.splitlines()[-n:])

    hint = lost_hint(Handle())
    assert "Timeout (0:00:00.500000)!" in hint and "hold_the_lock" in hint
    assert len(hint.splitlines()) > 60


_PULSED = """
import ctypes, os, sys, threading, time
import experiment_design.participant as p
p.HEARTBEAT_S, p.STALL_DUMP_S = 0.1, 0.5
pulse = p.start_pulse()
threading.Thread(target=p._heartbeat, args=(pulse,), daemon=True).start()
print("PULSE", pulse.pid, flush=True)
time.sleep(0.5)
os.write(1, b"HOLD\\n")
ctypes.PyDLL(None).usleep(1_500_000)  # holds the interpreter lock
os.write(1, b"FREE\\n")
time.sleep(float(sys.argv[1]))
"""


def test_the_heartbeat_helper_beats_while_the_interpreter_is_held():
    """The heartbeat comes from a helper process that needs no lock of the participant's
    interpreter: it beats through a 1.5 s hold of the lock, where the thread alone fell
    silent (a participant on a host held to 0.1 core was once called lost while it ran a
    call into C). Fails on the code before (no helper: no beat between HOLD and FREE)."""
    out = subprocess.run([sys.executable, "-c", _PULSED, "0.3"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    held = lines[lines.index("HOLD") + 1:lines.index("FREE")]
    assert held.count(ALIVE_LINE) >= 10, lines  # every 0.1 s of the 1.5 s
    assert set(held) == {ALIVE_LINE}
    assert "participant: the interpreter was held for" in out.stderr  # and said so
    assert "the heartbeat helper beat meanwhile" in out.stderr


def test_the_heartbeat_helper_falls_silent_with_a_stopped_participant_and_dies_with_it():
    import signal

    import psutil

    proc = subprocess.Popen([sys.executable, "-c", _PULSED, "60"], cwd=REPO,
                            stdout=subprocess.PIPE, bufsize=0)
    try:
        first = proc.stdout.readline().decode().split()
        assert first[0] == "PULSE", first
        helper = psutil.Process(int(first[1]))
        assert helper.ppid() == proc.pid and "experiment_design.participant" not in \
            " ".join(helper.cmdline())  # a test's search for participants never finds it
        while proc.stdout.readline().strip() != b"FREE":
            pass
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)

        def beats_within(s: float) -> int:
            time.sleep(s)
            try:
                return os.read(fd, 1 << 16).decode().count(ALIVE_LINE)
            except BlockingIOError:
                return 0

        assert beats_within(0.6) >= 3
        proc.send_signal(signal.SIGSTOP)
        beats_within(0.15)  # a beat on its way when the stop came
        assert beats_within(0.8) == 0  # stopped: silent, as the observer must see it
        proc.send_signal(signal.SIGCONT)
        assert beats_within(0.6) >= 3
        proc.kill()
        proc.wait(timeout=10)
        helper.wait(timeout=5)  # PR_SET_PDEATHSIG: it goes with the participant
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


_HOLDER = """
import ctypes, time
for _ in range(4):  # the interpreter lock held 4 x 1.5 s (a slow host's import of torch)
    ctypes.PyDLL(None).usleep(1_500_000)
    time.sleep(0.002)
"""


def test_a_held_interpreter_does_not_take_the_observers_heartbeats_for_silence(tmp_path):
    """A participant whose interpreter lock is held longer than its idle limit (here a
    plugin's import; on a lab host held to 0.1 core, importing torch held it 38 s) while
    the observer beats on stdin: the beats wait unread in the pipe, and the idle watch must
    not judge the silence before the reader has had its turn. Fails on the code before: it
    ended itself with "no heartbeat or call from the observer for 1 s" before it was ready
    (as a participant on CI did, under the 30 s limit)."""
    import threading

    (tmp_path / "tracr_test_holder.py").write_text(_HOLDER)
    secret = os.urandom(32)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "experiment_design.participant", "--role", "cloud",
         "--idle-timeout", "1", "--plugins", "tracr_test_holder"],
        cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    stop = threading.Event()

    def beat() -> None:  # the observer's heartbeat, every 0.1 s
        try:
            while not stop.wait(0.1):
                proc.stdin.write(b"\n")
                proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    try:
        proc.stdin.write(secret.hex().encode() + b"\n")
        proc.stdin.flush()
        threading.Thread(target=beat, daemon=True).start()
        line = proc.stdout.readline().decode()
        while line.strip() == ALIVE_LINE:
            line = proc.stdout.readline().decode()
        assert line.startswith("TRACR-READY "), (line, proc.stderr.read().decode()
                                                  if proc.poll() is not None else "")
        ready = json.loads(line.split(" ", 1)[1])
        conn = connect_control("127.0.0.1", ready["port"], secret)
        assert json.loads(conn.root.hello())["role"] == "cloud"
        time.sleep(2.5)  # beating on: it stays, past its idle limit
        assert proc.poll() is None
        stop.set()  # the observer falls silent, its stdin open: the watch ends it
        assert wait_exit(proc) == 0
        err = proc.stderr.read().decode()
        assert err.count("participant exiting: no heartbeat or call from the observer") == 1
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            f.close()
