"""A throwaway sshd on 127.0.0.1 with its own keys: an SSH device on one machine.

Used by ``tracr bench deploy`` when no device is given and by the integration
tests. Everything lives in one temp dir; :meth:`LoopbackSshd.stop` ends the
daemon by PID and removes the dir.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from app_api.devices.registry import Device
from experiment_design.errors import TracrError

SSHD = "/usr/sbin/sshd"


@dataclass
class LoopbackSshd:
    """A running sshd on the loopback interface, with its own keys and files."""

    host: str
    port: int
    user: str
    key: str  # private key authorized for ``user``
    known_hosts: str  # known_hosts file holding this sshd's host key
    dir: str
    pid: int
    log: str
    tmp: str = ""  # TMPDIR of its sessions: where deploys make their temp dirs
    _proc: subprocess.Popen | None = None

    def ssh_argv(self, command: str | None = None) -> list[str]:
        """An ssh command line logging into this sshd (host key checked)."""
        argv = [
            "ssh", "-p", str(self.port), "-i", self.key, "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
            f"{self.user}@{self.host}",
        ]  # fmt: skip
        return argv + ([command] if command is not None else [])

    def device(self, name: str = "loop", **overrides):
        """A :class:`Device` for this sshd (python defaults to this interpreter)."""
        fields = dict(
            name=name, host=self.host, port=self.port, user=self.user, key=self.key,
            python=sys.executable, known_hosts=self.known_hosts,
        )  # fmt: skip
        fields.update(overrides)
        return Device(**fields)

    def stop(self) -> None:
        """Stop the daemon (by PID) and remove its directory."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_loopback_sshd(sshd: str = SSHD, timeout: float = 10.0) -> LoopbackSshd:
    """Start sshd on 127.0.0.1:<free port> for the current user; raise TracrError if it cannot."""
    if not os.path.exists(sshd):
        raise TracrError(f"{sshd} not found.", hint="apt-get install openssh-server")
    root = Path(tempfile.mkdtemp(prefix="tracr-sshd-"))
    os.chmod(root, 0o700)
    for kind in ("host", "user"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"tracr-loopback-{kind}",
             "-f", str(root / f"{kind}_key")],
            check=True,
        )  # fmt: skip
    shutil.copy(root / "user_key.pub", root / "authorized_keys")
    os.chmod(root / "authorized_keys", 0o600)
    # Sessions get a TMPDIR of their own, so a test can tell exactly what a deploy left
    # behind even while other tracr runs use /tmp on the same machine.
    (root / "tmp").mkdir(mode=0o700)
    port = _free_port()
    user = getpass.getuser()
    (root / "sshd_config").write_text(
        f"""Port {port}
ListenAddress 127.0.0.1
HostKey {root}/host_key
PidFile {root}/sshd.pid
AuthorizedKeysFile {root}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowUsers {user}
StrictModes no
UsePAM no
AllowTcpForwarding local
X11Forwarding no
PrintMotd no
MaxStartups 100:30:200
MaxSessions 50
LogLevel ERROR
SetEnv TMPDIR={root}/tmp
"""
    )
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation dir
    log = root / "sshd.log"
    with open(log, "wb") as log_fh:
        proc = subprocess.Popen(
            [sshd, "-D", "-e", "-f", str(root / "sshd_config")],
            stdout=subprocess.DEVNULL, stderr=log_fh, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            text = log.read_text(errors="replace")[-500:]
            shutil.rmtree(root, ignore_errors=True)
            raise TracrError(f"cannot start a loopback sshd: {text.strip() or 'no output'}")
        time.sleep(0.05)
    algo, blob = (root / "host_key.pub").read_text().split()[:2]
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {algo} {blob}\n")
    return LoopbackSshd(
        host="127.0.0.1", port=port, user=user, key=str(root / "user_key"),
        known_hosts=str(root / "known_hosts"), dir=str(root), pid=proc.pid, log=str(log),
        tmp=str(root / "tmp"), _proc=proc,
    )  # fmt: skip
