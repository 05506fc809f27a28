"""One sshd per lab host: its host key, config, process, and the client side (key, known_hosts).

sshd runs as root in every lab host, so everything it reads (config, host key,
authorized keys) lives in the root-only :func:`app_api.lab.state.sshd_dir` and sshd
checks that itself (``StrictModes yes``). The observer's client key is copied out to the
user who ran ``sudo``; the user's copy grants nothing by being rewritten.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

from app_api import fsutil
from app_api.lab.system import pid_alive, run
from experiment_design.errors import TracrError

log = logging.getLogger(__name__)

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")


def sshd_binary() -> str:
    """Absolute path of sshd, or a TracrError saying how to install it."""
    for cand in (*SSHD_CANDIDATES, shutil.which("sshd") or ""):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise TracrError(
        "the tracr lab needs an OpenSSH server binary (sshd), which is not installed",
        hint="apt-get install openssh-server (the system service need not run)",
    )


def make_key(path: Path, comment: str) -> str:
    """Generate an ed25519 key pair at ``path`` (no passphrase); return the public key line.

    ``path`` must be in a directory only root can write (ssh-keygen follows links).
    """
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    path.chmod(0o600)
    return path.with_name(path.name + ".pub").read_text().strip()


def write_config(host_dir: Path, address: str, host_key: Path, authorized_keys: Path) -> Path:
    """Write the sshd_config of one lab host; return its path."""
    sftp = next(
        (
            p
            for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server")
            if os.path.exists(p)
        ),
        "internal-sftp",
    )
    text = f"""# tracr lab sshd for {address} (generated; removed by 'tracr lab down')
ListenAddress {address}:22
HostKey {host_key}
PidFile {host_dir / "sshd.pid"}
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# Every key file sits in a root-only directory; sshd refuses them if that ever changes.
StrictModes yes
UseDNS no
PrintMotd no
AllowTcpForwarding yes
AllowStreamLocalForwarding yes
X11Forwarding no
MaxStartups 64:30:128
MaxSessions 64
ClientAliveInterval 15
ClientAliveCountMax 4
Subsystem sftp {sftp}
"""
    return fsutil.atomic_write(host_dir / "sshd_config", text, mode=0o600, for_user=False)


def ensure_privsep_dir() -> bool:
    """Create sshd's privilege-separation dir if missing (Debian's sshd refuses to start without
    it); True if we created it. It is a standard system path and is left in place on ``down``."""
    if PRIVSEP_DIR.exists():
        return False
    PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    return True


def start_sshd(ns: str, config: Path, log_path: Path) -> int:
    """Start ``sshd -D`` inside namespace ``ns``; return its PID (``ip netns exec`` execs in place)."""
    binary = sshd_binary()
    ensure_privsep_dir()
    test = run(["ip", "netns", "exec", ns, binary, "-t", "-f", str(config)], check=False)
    if test.returncode != 0:
        raise TracrError(
            f"sshd rejected the generated config {config}: {test.stderr.strip()}",
            hint="check the openssh-server installation ('sshd -t')",
        )
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, binary, "-D", "-f", str(config), "-E", str(log_path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # Ctrl-C on `tracr lab up` must not kill the hosts' sshds
    )
    return proc.pid


def wait_listening(
    address: str, port: int = 22, timeout: float = 10.0, pid: int | None = None
) -> None:
    """Block until ``address:port`` accepts TCP connections from the root namespace."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if pid is not None and not pid_alive(pid):
            raise TracrError(
                f"sshd for {address} exited at start-up", hint="see its log under the lab dir"
            )
        try:
            with socket.create_connection((address, port), timeout=1.0) as s:
                if s.recv(4).startswith(b"SSH-"):
                    return
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise TracrError(
        f"sshd for {address}:{port} did not start listening within {timeout:g} s ({last})"
    )


def host_key_line(address: str, pub_line: str, port: int = 22) -> str:
    """A known_hosts line for a host key (``[addr]:port`` form for non-22 ports)."""
    keytype, key = pub_line.split()[:2]
    host = address if port == 22 else f"[{address}]:{port}"
    return f"{host} {keytype} {key}"


def add_known_hosts(path: Path, lines: list[str]) -> None:
    """Add host-key lines to ``path``, replacing older lines for the same hosts.

    Rewritten atomically, no link followed, and the invoking user's under sudo.
    """
    hosts = {line.split()[0] for line in lines}
    old = (fsutil.read_text(path) or "").splitlines()
    keep = [line for line in old if not (line.split() and line.split()[0] in hosts)]
    fsutil.atomic_write(path, "".join(line + "\n" for line in [*keep, *lines]), mode=0o600)


def remove_known_hosts(path: Path, hosts: set[str]) -> int:
    """Drop the lines of ``hosts`` from ``path``; return how many lines were removed."""
    old = (fsutil.read_text(path) or "").splitlines()
    keep = [line for line in old if not (line.split() and line.split()[0] in hosts)]
    if len(keep) != len(old):
        fsutil.atomic_write(path, "".join(line + "\n" for line in keep), mode=0o600)
    return len(old) - len(keep)


def is_our_sshd(pid: int, config: str, log_path: str) -> bool:
    """True if ``pid`` is the sshd ``lab up`` started with this config and log.

    Read from /proc: the executable must be sshd, and the command line ours (sshd's
    listener rewrites it as ``sshd: /usr/sbin/sshd -D -f CONFIG -E LOG [listener] ...``).
    """
    try:
        exe = os.readlink(f"/proc/{int(pid)}/exe")
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            text = " ".join(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
    except (OSError, ValueError):
        return False
    if not os.path.basename(exe).startswith("sshd"):
        return False
    ours = re.escape(f"-D -f {config} -E {log_path}")
    return re.fullmatch(rf"(sshd: )?\S*sshd {ours}( \[listener\].*)?", text) is not None
