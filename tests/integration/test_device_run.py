"""`tracr experiment run` with both participants on an SSH device (a real sshd on 127.0.0.1).

The observer is the real command in a subprocess; the participants are
zero-deployed over SSH into temp venvs. Each test ends by checking that the
device holds nothing of the run: no participant process, no temp dir (the
sshd gives its sessions a TMPDIR of their own, so this is exact even while
other tracr runs use /tmp), and no ssh client of the observer's left running.
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

from app_api.devices.registry import DeviceRegistry
from tests.integration.helpers import wait_rows

pytestmark = [pytest.mark.integration, pytest.mark.ssh]

REPO = Path(__file__).resolve().parents[2]
PARTICIPANT = "experiment_design.participant"
SPLITS = [0, 8, 22]


@pytest.fixture(scope="module")
def registry(loopback_sshd, tmp_path_factory) -> Path:
    """A device registry holding the loopback sshd as device ``loop``."""
    reg = DeviceRegistry(tmp_path_factory.mktemp("devreg") / "devices.yaml")
    reg.add(loopback_sshd.device("loop"))
    reg.save()
    return reg.path


def start_observer(
    registry: Path, out: Path, *overrides: str, group: bool = False
) -> subprocess.Popen:
    """`python app.py experiment run alexnet-sweep` with both participants on ``loop``."""
    sets = ["participant_instances.edge-1.device=loop", "participant_instances.cloud-1.device=loop",
            f"+partitioner.params.splits={json.dumps(SPLITS)}", "dataset.params.limit=1",
            "run.warmup=1", "partitioner.params.repeats=1", *overrides]  # fmt: skip
    cmd = [sys.executable, str(REPO / "app.py"), "experiment", "run", "alexnet-sweep",
           "--no-progress", "--out", str(out), *sum((["--set", s] for s in sets), [])]  # fmt: skip
    env = dict(os.environ, TRACR_DEVICES=str(registry))
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=group)  # fmt: skip


def remote_participants(sshd) -> list[psutil.Process]:
    """Participant processes the sshd started (on loopback the device is this machine)."""
    try:
        kids = psutil.Process(sshd.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for k in kids:
        try:
            # the python itself, not its sh wrapper (whose one -c argument names it too)
            if PARTICIPANT in k.cmdline() and k.status() != psutil.STATUS_ZOMBIE:
                out.append(k)
        except psutil.NoSuchProcess:
            pass
    return out


def role_of(p: psutil.Process) -> str:
    cmd = p.cmdline()
    return cmd[cmd.index("--role") + 1]


def ssh_clients(sshd) -> list[int]:
    """ssh client processes (masters, forwards) talking to this sshd, whoever their parent."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if cmd and os.path.basename(cmd[0]) == "ssh" and str(sshd.port) in cmd:
            found.append(p.info["pid"])
    return found


def temp_dirs(sshd) -> list[str]:
    """Everything in the device sessions' TMPDIR (deploy dirs, and any cache torch makes)."""
    return sorted(os.listdir(sshd.tmp))


def assert_nothing_left(sshd, pids: list[int] = (), dirs: list[str] = ()) -> None:
    deadline = time.monotonic() + 10  # the sh wrapper's rm -rf may still be running
    while time.monotonic() < deadline:
        left = (remote_participants(sshd), temp_dirs(sshd), ssh_clients(sshd),
                [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status()
                 != psutil.STATUS_ZOMBIE], [d for d in dirs if os.path.exists(d)])  # fmt: skip
        if not any(left):
            return
        time.sleep(0.2)
    raise AssertionError(f"left behind (participants, temp dirs, ssh, pids, dirs): {left}")


def stop(proc: subprocess.Popen) -> None:
    """Kill the observer if a failed assertion left it running (and reap it)."""
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def finish(proc: subprocess.Popen, timeout: float = 90) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            stop(proc)


def test_experiment_run_over_ssh(loopback_sshd, registry, tmp_path):
    from app_api.results import read_csv
    from tests.integration.test_runner_run import reference_outputs

    out = tmp_path / "run"
    proc = start_observer(registry, out)
    stdout, err = finish(proc, timeout=150)
    assert proc.returncode == 0, err
    rows = read_csv(out / "inferences.csv")
    assert [int(r["split"]) for r in rows] == SPLITS
    assert not [r for r in rows if r["error"]]
    assert all(float(r["e2e_ms"]) > 0 for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["inferences"] == 3 and summary["failed"] == 0
    assert [sp["split"] for sp in summary["splits"]] == SPLITS
    env = json.loads((out / "environment.json").read_text())
    assert set(env) == {"edge-1", "cloud-1"}
    for e in env.values():  # both really ran behind the sshd, not as local processes
        assert e["device_name"] == "loop" and str(loopback_sshd.port) in e["host_label"]
    # the split run over SSH reproduces the unsplit model
    (top1, total), = reference_outputs("alexnet", 1)  # fmt: skip
    for r in rows:
        assert int(r["top1"]) == top1
        assert abs(float(r["output_sum"]) - total) <= 1e-4 * max(1.0, abs(total)), r
    assert_nothing_left(loopback_sshd)


@pytest.mark.parametrize("to_group", [False, True], ids=["sigint", "terminal-ctrl-c"])
def test_ctrl_c_mid_run_over_ssh_leaves_nothing(loopback_sshd, registry, tmp_path, to_group):
    # terminal-ctrl-c: SIGINT to the observer's whole process group, as a terminal sends it
    out = tmp_path / "run"
    proc = start_observer(registry, out, "partitioner.params.repeats=50", group=to_group)
    try:
        wait_rows(out / "inferences.csv", proc, 2)
        ps = remote_participants(loopback_sshd)
        assert sorted(role_of(p) for p in ps) == ["cloud", "edge"]
        pids, dirs = [p.pid for p in ps], temp_dirs(loopback_sshd)
        assert len(dirs) == 2
        if to_group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        _, err = finish(proc, timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 130, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["inferences"] >= 2
    assert_nothing_left(loopback_sshd, pids, [os.path.join(loopback_sshd.tmp, d) for d in dirs])


def test_killed_remote_participant_fails_the_run(loopback_sshd, registry, tmp_path):
    from app_api.results import read_csv

    out = tmp_path / "run"
    proc = start_observer(registry, out, "partitioner.params.repeats=50")
    try:
        wait_rows(out / "inferences.csv", proc, 2)
        ps = remote_participants(loopback_sshd)
        pids = [p.pid for p in ps]
        next(p for p in ps if role_of(p) == "cloud").kill()  # kill -9 the remote python
        _, err = finish(proc, timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 1, err
    assert "cloud-1" in err
    rows = read_csv(out / "inferences.csv")
    bad = [r for r in rows if r["error"]]
    assert bad and "cloud-1" in bad[-1]["error"] and bad[-1]["e2e_ms"] == ""
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failed"] >= 1
    assert_nothing_left(loopback_sshd, pids)
