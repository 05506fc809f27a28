"""The device's side of an SSH launch, seen from the observer: control sockets, ports, leftovers.

Small helpers :mod:`app_api.launch.ssh` builds on: where the per-participant
ssh ControlMaster sockets live, a free local port to forward, and what a
launch left on a device (for :meth:`ParticipantHandle.leftovers`).
"""

from __future__ import annotations

import os
import shlex
import socket
import tempfile

from app_api.devices import ssh
from app_api.devices.registry import Device
from experiment_design.errors import TracrError


def control_dir() -> str:
    """A private directory for ssh control sockets (one per user, reused; sockets vanish)."""
    path = os.path.join(tempfile.gettempdir(), f"tracr-ssh-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if st.st_uid != os.getuid() or not os.path.isdir(path) or os.path.islink(path):
        raise TracrError(f"{path} is not a private directory of this user.", hint=f"Remove {path}.")
    os.chmod(path, 0o700)
    return path


def free_local_port() -> int:
    """A loopback port that was free a moment ago (a forward may lose it in a race)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def remote_leftovers(device: Device, workdir: str | None, pid: int | None) -> list[str]:
    """Processes whose PID is ``pid`` or whose command line names ``workdir``, and the dir itself."""
    # The script goes on stdin so no command line (not even ssh's, on loopback) names workdir.
    script = "echo SELF $$; ps -eo pid=,ppid=,args=\n"
    if workdir:
        script += f"if [ -e {shlex.quote(workdir)} ]; then echo DIR-PRESENT; fi\n"
    cp = ssh.run_ssh(device, "sh -s", input=script.encode(), timeout=30)
    lines = cp.stdout.decode(errors="replace").splitlines()
    me = next((ln.split()[1] for ln in lines if ln.startswith("SELF ")), "")
    found = []
    for ln in lines:
        if ln.startswith(("SELF ", "DIR-PRESENT")):
            continue
        parts = ln.split(None, 2)
        if len(parts) < 3 or me in parts[:2]:
            continue
        if (pid and parts[0] == str(pid)) or (workdir and workdir in parts[2]):
            found.append(f"process {parts[0]}: {parts[2]}")
    if "DIR-PRESENT" in lines:
        found.append(f"directory {workdir}")
    return found
