"""Every wait bounded: a silent partner, Ctrl-C, a slow start, a chatty participant, a timeout.

Real processes and real faults: the cloud participant is SIGSTOPped mid-sweep (what a
device that loses power or its link looks like), the observer gets a real SIGINT, a
participant's ``import torch`` really takes 60 s, a participant really writes more than
a pipe holds. The slow import and the chatter are injected by a ``sitecustomize`` on the
participants' PYTHONPATH (``SITE`` below), which works on any version of the code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.helpers import wait_rows
from tests.integration.test_runner_run import gone, participants, workdirs

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

# Loaded by every python started with it on PYTHONPATH; acts only in participant processes
# of the role named in the environment.
SITE = r'''
import os, sys, threading, time

def _role():
    return sys.argv[sys.argv.index("--role") + 1] if "--role" in sys.argv else None

_slow = os.environ.get("TRACR_TEST_SLOW_TORCH", "")  # "ROLE:SECONDS"
if _slow and _role() == _slow.split(":")[0]:
    class _SlowTorch:
        """``import torch`` takes SECONDS longer (a Raspberry Pi's first import)."""
        done = False
        def find_spec(self, name, path=None, target=None):
            if name == "torch" and not self.done:
                self.done = True
                time.sleep(float(_slow.split(":")[1]))
            return None
    sys.meta_path.insert(0, _SlowTorch())

_chatty = os.environ.get("TRACR_TEST_CHATTY", "")  # "ROLE:BYTES:MARKER"
if _chatty and _role() == _chatty.split(":")[0]:
    def _chatter(n=int(_chatty.split(":")[1]), marker=_chatty.split(":", 2)[2]):
        time.sleep(3)  # after READY, as a user model's print or a library's logging would
        line = "x" * 99
        for _ in range(n // 100 + 1):
            print(line, flush=True)
        open(marker, "w").close()
    threading.Thread(target=_chatter, daemon=True).start()

_stuck = os.environ.get("TRACR_TEST_STUCK", "")  # "ROLE:CALL"
if _stuck and _role() == _stuck.split(":")[0]:
    import importlib.machinery

    class _StuckCall:
        """The role's control call CALL never returns; the process and its heartbeats go
        on (a device hung in a driver, a deadlock in user code)."""
        def find_spec(self, name, path=None, target=None):
            if name != "experiment_design.roles.base":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)

                def stuck(self, *args):
                    threading.Event().wait()

                setattr(module.ParticipantService, "exposed_" + _stuck.split(":")[1], stuck)
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, _StuckCall())
'''


def site_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment with :data:`SITE` on PYTHONPATH and ``extra`` set."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITE)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(site),
                                                      env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def start_cli(tmp_path: Path, *overrides: str, env: dict | None = None) -> subprocess.Popen:
    """``tracr experiment run alexnet-sweep`` with ``overrides``, results in tmp_path/run."""
    cmd = [sys.executable, str(REPO / "app.py"), "experiment", "run", "alexnet-sweep",
           "--no-progress", "--out", str(tmp_path / "run"),
           "--set", "run.warmup=1", "--set", "dataset.params.limit=1",
           *sum((["--set", o] for o in overrides), [])]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def role_of(p: psutil.Process) -> str:
    cmd = p.cmdline()
    return cmd[cmd.index("--role") + 1]


def release(ps: list[psutil.Process]) -> None:
    """Kill what a failed test left (participants this test started, by PID)."""
    for p in ps:
        try:
            p.send_signal(signal.SIGCONT)
            p.kill()
        except psutil.NoSuchProcess:
            pass


def launched(proc: subprocess.Popen) -> list[psutil.Process]:
    """The participants the observer ``proc`` started (its own children: not a process a
    participant forks on its way up, which carries the same command line)."""
    out = []
    for p in psutil.Process(proc.pid).children():
        try:
            if "experiment_design.participant" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def summary_of(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "summary.json").read_text())


@pytest.mark.slow
def test_a_stopped_partner_ends_the_run_by_itself(tmp_path):
    proc = start_cli(tmp_path, "partitioner.params.repeats=50", "run.liveness_timeout_s=5")
    ps: list[psutil.Process] = []
    try:
        wait_rows(tmp_path / "run" / "inferences.csv", proc, timeout=150)
        ps = participants(proc)
        dirs = workdirs(ps)
        cloud = next(p for p in ps if role_of(p) == "cloud")
        cloud.suspend()  # SIGSTOP: a device that lost power or its link, mid-sweep
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        release(ps)
    print(f"run ended {took:.1f} s after the partner stopped (liveness timeout 5 s)")
    assert proc.returncode == 1, err
    assert took < 30
    assert "cloud-1 on localhost silent for 5 s (lost)" in err
    assert all(gone(p.pid) for p in ps)
    assert not any(os.path.exists(d) for d in dirs)
    summary = summary_of(tmp_path)
    assert summary["status"] == "failed" and summary["inferences"] >= 2  # rows kept
    assert any("cloud-1 on localhost silent for 5 s (lost)" in e for e in summary["errors"])


@pytest.mark.slow
def test_ctrl_c_with_a_stopped_partner_ends_within_seconds(tmp_path):
    proc = start_cli(tmp_path, "partitioner.params.repeats=50")
    ps: list[psutil.Process] = []
    try:
        wait_rows(tmp_path / "run" / "inferences.csv", proc, timeout=150)
        ps = participants(proc)
        dirs = workdirs(ps)
        next(p for p in ps if role_of(p) == "cloud").suspend()
        time.sleep(1.0)  # the edge is now waiting on the stopped partner
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        release(ps)
    print(f"Ctrl-C with a stopped partner: ended in {took:.1f} s")
    assert proc.returncode == 130, err
    assert took < 10  # 5 s is the target; the margin is for a loaded test machine
    assert all(gone(p.pid) for p in ps)
    assert not any(os.path.exists(d) for d in dirs)
    assert summary_of(tmp_path)["status"] == "interrupted"


@pytest.mark.slow
def test_a_partner_slow_to_start_is_not_killed(tmp_path):
    # the edge's `import torch` takes 60 s more; the cloud is ready at once and gets no
    # call meanwhile: heartbeats on stdio keep both alive (default timeouts, 30 s)
    env = site_env(tmp_path, TRACR_TEST_SLOW_TORCH="edge:60")
    t0 = time.monotonic()
    proc = start_cli(tmp_path, "partitioner.params.repeats=1", env=env)
    try:
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert time.monotonic() - t0 >= 60
    summary = summary_of(tmp_path)
    assert summary["status"] == "ok" and summary["inferences"] > 0


def test_a_participant_printing_more_than_a_pipe_holds_does_not_block(tmp_path, monkeypatch):
    from app_api.launch import LocalLauncher, ParticipantSpec

    marker = tmp_path / "printed"
    for k, v in site_env(tmp_path, TRACR_TEST_CHATTY=f"cloud:{256 * 1024}:{marker}").items():
        monkeypatch.setenv(k, v)
    h = LocalLauncher().start(ParticipantSpec("cloud-1", "cloud", "localhost", 1, os.urandom(32)))
    try:
        deadline = time.monotonic() + 20
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), "the participant's print of 256 KiB blocked"
        # the print returns once its last bytes are in the pipe: up to a pipe's worth
        # (64 KiB, ~600 lines) is still on its way to the reader when the marker appears
        while h.stdout_lines < 2600 and time.monotonic() < deadline + 10:
            time.sleep(0.05)
        assert h.stdout_lines >= 2600 and h.silent_for() < 5 and h.alive()
    finally:
        h.stop()
    assert h.leftovers() == []


@pytest.mark.slow
def test_run_timeout_ends_the_run(tmp_path):
    proc = start_cli(tmp_path, "partitioner.params.repeats=200", "run.timeout_s=30")
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert "run.timeout_s (30 s) reached" in err
    summary = summary_of(tmp_path)
    assert summary["status"] == "failed"
    assert "run.timeout_s (30 s) reached" in summary["errors"]
    assert (tmp_path / "run" / "inferences.csv").exists()


@pytest.mark.slow
@pytest.mark.parametrize("call,bound", [("setup", "run.startup_timeout_s=10"),
                                        ("start_task", None)])
def test_a_participant_stuck_inside_a_call_is_named_and_stopped(tmp_path, call, bound):
    """The cloud is alive (its heartbeats arrive) but one control call never returns: the
    observer ends the run within the call's bound (``run.startup_timeout_s`` for a call
    that builds or measures, ``SHORT_CALL_S`` for the others), names the participant and
    the call, and leaves no process and no temp dir."""
    from app_api.runner.client import SHORT_CALL_S

    env = site_env(tmp_path, TRACR_TEST_STUCK=f"cloud:{call}")
    limit = 10.0 if bound else SHORT_CALL_S
    t0 = time.monotonic()
    proc = start_cli(tmp_path, "partitioner.params.repeats=1", *filter(None, [bound]), env=env)
    ps: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while len(ps) < 2 and proc.poll() is None and time.monotonic() < deadline:
            ps = launched(proc)
            time.sleep(0.2)
        assert len(ps) == 2, f"the participants did not start: {ps}"
        dirs = workdirs(ps)
        _, err = proc.communicate(timeout=limit + 120)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        release(ps)
    print(f"run with a stuck {call}() ended after {took:.1f} s (bound {limit:.0f} s)")
    assert proc.returncode == 1, err
    assert f"cloud-1 on localhost: {call}() did not answer within {limit:.0f} s" in err, err
    assert took < limit + 60
    assert all(gone(p.pid) for p in ps)
    assert not any(os.path.exists(d) for d in dirs)
    summary = summary_of(tmp_path)
    assert summary["status"] == "failed"
    assert any(f"cloud-1 on localhost: {call}()" in e for e in summary["errors"]), summary
