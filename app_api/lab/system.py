"""Running the system tools the lab is built from (``ip``, ``tc``, ``ssh-keygen``)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from experiment_design.errors import TracrError

log = logging.getLogger(__name__)


class LabCommandError(TracrError):
    """A system command the lab needs failed; the message says which and why."""


def require_root() -> None:
    """Raise a TracrError (exit 2) unless we are root on Linux with ``ip`` available."""
    if not sys.platform.startswith("linux"):
        raise TracrError(
            f"the tracr lab needs Linux network namespaces (this is {sys.platform})",
            hint="use the built-in 'localhost' device, or pair real devices with 'tracr device pair'",
        )
    if os.geteuid() != 0:
        raise TracrError(
            "the tracr lab needs root (it creates network namespaces, links and cgroups)",
            hint="run it as root, e.g. 'sudo -E tracr lab up' (-E keeps TRACR_CONFIG_DIR)",
        )
    for tool in ("ip", "tc", "ssh-keygen"):
        if not shutil.which(tool):
            raise TracrError(
                f"the tracr lab needs '{tool}', which is not installed",
                hint="apt-get install iproute2 openssh-client openssh-server",
            )


def run(
    cmd: list[str], *, check: bool = True, timeout: float = 30.0
) -> subprocess.CompletedProcess:
    """Run ``cmd``; on failure raise LabCommandError with the command and its stderr."""
    log.debug("lab: %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise LabCommandError(
            f"command failed (exit {proc.returncode})\n"
            f"  Command line | {' '.join(cmd)}\n"
            f"  Stderr       | {proc.stderr.strip()}"
        )
    return proc


def ok(cmd: list[str]) -> bool:
    """True if ``cmd`` exits 0 (errors are expected and swallowed, e.g. deleting what is gone)."""
    try:
        return run(cmd, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def pid_alive(pid: int | None) -> bool:
    """True if a process with this PID exists and is not a zombie."""
    if not pid:
        return False
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def stop_pid(pid: int | None, timeout: float = 5.0) -> bool:
    """SIGTERM then SIGKILL one PID we started; reap it if it is our child. True if it was alive."""
    if not pid or not pid_alive(pid):
        _reap(pid)
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid):
            # it may have exited between the reap and the check: a zombie is not alive,
            # and it stays one until reaped
            _reap(pid)
            return True
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reap(pid)
    return True


def _reap(pid: int | None) -> None:
    if not pid:
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        pass


# starts one helper in a session of its own, prints its PID and exits at once: the helper
# is then the child of init, not of the process that brought the lab up
_LAUNCH = (
    "import subprocess, sys\n"
    "with open(sys.argv[1], 'ab') as log:\n"
    "    p = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, "
    "stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)\n"
    "print(p.pid)\n"
)


def start_helper(cmd: list[str], log_path: Path) -> int:
    """Start one of the lab's helper processes (the pacer, the link emulator) in a session
    of its own (a Ctrl-C on ``lab up`` must not stop it), its stderr appended to
    ``log_path``, with tracr importable; its PID.

    The helper outlives the process that starts it, so it is started through a launcher
    that exits at once, and init, not that process, reaps it. Started as a child, a helper
    that died while a long-lived process held the lab (``app_api.lab.up()`` in a test, a
    notebook) stayed a zombie of that process: no one else can reap it, and ``lab down``
    finds helpers by their command line, which a zombie no longer has (two killed link
    emulators were left in the full test suite for its last 30 minutes)."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", _LAUNCH, str(log_path), *cmd], env=env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    if out.returncode != 0 or not out.stdout.strip().isdigit():
        raise TracrError(f"cannot start the lab helper {cmd[:3]}: "
                         f"{(out.stderr or out.stdout).strip()[-300:] or 'no output'}")
    return int(out.stdout.strip())


def helper_is_ours(pid: int | None, entry: str, alive: Path) -> bool:
    """True if ``pid`` runs ``python -c entry`` for the lab whose state file is ``alive``."""
    if not pid or not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return (len(argv) > 2 and argv[1:3] == [b"-c", entry.encode()]
            and str(alive).encode() in argv)


def find_helpers(entry: str, alive: Path) -> list[int]:
    """PIDs of every ``python -c entry`` of the lab whose state file is ``alive``."""
    return [int(e.name) for e in Path("/proc").iterdir()
            if e.name.isdigit() and helper_is_ours(int(e.name), entry, alive)]


def logged(path: Path, line: str) -> bool:
    """True if the log at ``path`` has a line starting with ``line`` (a helper's ready line)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return False
    return any(row.startswith(line) for row in text.splitlines())
