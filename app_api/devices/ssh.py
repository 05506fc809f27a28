"""SSH plumbing shared by pairing, probing and deployment.

Every connection checks the host key against tracr's own known_hosts file
(recorded at pairing) with ``StrictHostKeyChecking=yes``; nothing here
ever answers "yes" to an unknown or changed key on the user's behalf.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from app_api.devices.registry import Device
from experiment_design.errors import TracrError

log = logging.getLogger(__name__)

HOST_KEY_CHANGED = "host key changed"
HOST_KEY_UNKNOWN = "host key unknown"
LOGIN_FAILED = "login failed"
UNREACHABLE = "unreachable"


# Characters a path may hold and still be written bare in an ssh_config line or `-o`.
_PLAIN = re.compile(r"[A-Za-z0-9_./+,:@=-]+")


def config_value(path: str | os.PathLike) -> str:
    """``path`` written so that ssh reads it back as exactly this one path.

    ssh parses each ``-o`` option (and each ssh_config line) like a shell would split
    words: an unquoted space ends the value (``UserKnownHostsFile`` then lists two
    files and no host key is found), ``#`` starts a comment, and ``%`` starts a token
    (``%h`` is the host) in the paths it expands. Plain paths stay bare; others are
    double-quoted with ``\\``, ``"`` and ``%`` escaped. ``${`` (an environment
    variable reference to ssh) cannot be escaped, so such a path is refused.
    """
    text = os.fspath(path)
    if _PLAIN.fullmatch(text):
        return text
    if "${" in text or "\n" in text or "\0" in text:
        raise TracrError(
            f"ssh cannot use the path {text!r}: it holds '${{', a newline or a NUL.",
            hint="Move tracr's files elsewhere (TRACR_CONFIG_DIR, --key) or rename the folder.",
        )
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped}"'


def ssh_options(
    device: Device,
    *,
    batch: bool = True,
    connect_timeout: int = 10,
    control_path: str | None = None,
) -> list[str]:
    """ssh client options for ``device`` (no host/command).

    ``control_path`` multiplexes every ssh sharing it over one connection (one key
    exchange per participant instead of one per command); the first becomes the master.
    """
    opts = [
        "-o", f"UserKnownHostsFile={config_value(device.known_hosts_file())}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "CheckHostIP=no",
        "-o", f"ConnectTimeout={connect_timeout}",
        "-o", "ServerAliveInterval=5",
        "-o", "ServerAliveCountMax=3",
        "-o", "LogLevel=ERROR",
    ]  # fmt: skip
    if batch:
        opts += ["-o", "BatchMode=yes"]
    if device.key:
        key = str(Path(device.key).expanduser())
        opts += ["-o", "IdentitiesOnly=yes"]
        # `-i` takes a plain path but ssh expands `%` tokens in it later, so a key path
        # with `%` (or anything quoting would change) goes through IdentityFile instead.
        plain = _PLAIN.fullmatch(key)
        opts += ["-i", key] if plain else ["-o", f"IdentityFile={config_value(key)}"]
    if device.port != 22:
        opts += ["-p", str(device.port)]
    if control_path:
        opts += [
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={config_value(control_path)}",
            "-o",
            "ControlPersist=no",
        ]
    return opts


def ssh_argv(device: Device, command: str | None = None, **kw) -> list[str]:
    """A full ``ssh`` command line running ``command`` (a remote shell string) on ``device``."""
    argv = ["ssh", *ssh_options(device, **kw), device.target]
    if command is not None:
        argv.append(command)
    return argv


def failure_block(
    command: str | Sequence[str], host: str, rc: int | None, stdout: str, stderr: str
) -> str:
    """A failed remote command as an aligned block, the way plumbum reports it."""
    if not isinstance(command, str):
        command = shlex.join(list(command))

    def indent(text: str) -> str:
        text = (text or "").strip()
        return (
            "\n".join(
                ("" if i == 0 else " " * 15) + line for i, line in enumerate(text.splitlines())
            )
            or "-"
        )

    return (
        f"Command line | {command}\n"
        f"Host         | {host}\n"
        f"Exit code    | {rc}\n"
        f"Stdout       | {indent(stdout)}\n"
        f"Stderr       | {indent(stderr)}"
    )


def classify_ssh_failure(stderr: str) -> str | None:
    """Map ssh's own stderr to a status word, or None if it is not an ssh failure."""
    text = stderr or ""
    if (
        "REMOTE HOST IDENTIFICATION HAS CHANGED" in text
        or "Host key for" in text
        and "has changed" in text
    ):
        return HOST_KEY_CHANGED
    if "Host key verification failed" in text or "No " in text and "host key is known" in text:
        return HOST_KEY_UNKNOWN
    if "Permission denied" in text or "Too many authentication failures" in text:
        return LOGIN_FAILED
    if any(
        s in text
        for s in ("Connection refused", "Connection timed out", "No route to host",
                  "Could not resolve hostname", "Network is unreachable", "Connection closed by",
                  "Connection reset")
    ):  # fmt: skip
        return UNREACHABLE
    return None


def ssh_error(device: Device, status: str, block: str) -> TracrError:
    """The TracrError for an ssh failure of kind ``status`` on ``device``."""
    if status == HOST_KEY_CHANGED:
        return TracrError(
            f"host key for {device.name} changed; if expected, run "
            f"`tracr device pair --name {device.name} --rekey`\n{block}",
            hint="A changed host key can mean the device was reinstalled, or that someone "
            "intercepts the connection. tracr refuses to connect until you re-pair.",
        )
    if status == HOST_KEY_UNKNOWN:
        return TracrError(
            f"no recorded host key for {device.name} ({device.host}:{device.port})\n{block}",
            hint=f"Run `tracr device pair --name {device.name} --rekey` to record it.",
        )
    if status == LOGIN_FAILED:
        return TracrError(
            f"login to {device.name} ({device.target}:{device.port}) failed\n{block}",
            hint=f"Install the key: ssh-copy-id -i {device.key or '~/.ssh/id_ed25519'}.pub "
            f"-p {device.port} {device.target}",
        )
    return TracrError(
        f"cannot reach {device.name} ({device.host}:{device.port})\n{block}",
        hint="Check that the device is on, sshd runs, and the host/port are right "
        f"(`tracr device check {device.name}`).",
    )


def run_ssh(
    device: Device,
    command: str,
    *,
    input: bytes | None = None,
    timeout: float = 60.0,
    check: bool = True,
    batch: bool = True,
    env: dict[str, str] | None = None,
    control_path: str | None = None,
) -> subprocess.CompletedProcess:
    """Run a remote shell command; on ssh or command failure raise a TracrError with the block."""
    argv = ssh_argv(device, command, batch=batch, control_path=control_path)
    log.debug("ssh: %s", shlex.join(argv))
    try:
        proc = spawn(argv, env=env)
        try:
            out, err = proc.communicate(input if input is not None else b"", timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        cp = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    except subprocess.TimeoutExpired as exc:
        block = failure_block(command, device.host, None, "", f"timed out after {timeout:.0f} s")
        raise TracrError(f"remote command on {device.name} timed out\n{block}") from exc
    if check and cp.returncode != 0:
        out = cp.stdout.decode(errors="replace")
        err = cp.stderr.decode(errors="replace")
        block = failure_block(command, device.host, cp.returncode, out, err)
        status = classify_ssh_failure(err) if cp.returncode == 255 else None
        if status:
            raise ssh_error(device, status, block)
        raise TracrError(f"remote command failed on {device.name}\n{block}")
    return cp


def spawn(argv: list[str], env: dict[str, str] | None = None, **popen_kwargs):
    """Start ``argv`` (an ssh command line) through plumbum's local machine.

    plumbum's ``SshMachine`` opens a remote shell and probes it on every connect (1–2 s
    per participant); deploy needs one ssh process with its streams, so tracr uses
    plumbum's local command layer to start ssh itself. Pipes are the default.
    """
    from plumbum import local

    for stream in ("stdin", "stdout", "stderr"):
        popen_kwargs.setdefault(stream, subprocess.PIPE)
    return local[argv[0]].popen(argv[1:], env=dict(os.environ) if env is None else env,
                                **popen_kwargs)


def tcp_reachable(host: str, port: int, timeout: float = 3.0) -> bool:
    """True if a TCP connection to host:port succeeds within ``timeout``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def keyscan(host: str, port: int, timeout: int = 5) -> list[str]:
    """The device's host keys as known_hosts lines (ssh-keyscan)."""
    if not shutil.which("ssh-keyscan"):
        raise TracrError("ssh-keyscan not found.", hint="Install the OpenSSH client.")
    cp = subprocess.run(
        ["ssh-keyscan", "-T", str(timeout), "-p", str(port), "-t", "ed25519,ecdsa,rsa", host],
        capture_output=True, text=True, timeout=timeout + 10,
    )  # fmt: skip
    lines = [ln for ln in cp.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
    if not lines:
        raise TracrError(
            f"could not read the host key of {host}:{port}\n"
            + failure_block(
                f"ssh-keyscan -p {port} {host}", host, cp.returncode, cp.stdout, cp.stderr
            ),
            hint="Check that sshd runs on the device and the host/port are right.",
        )
    return lines


def fingerprint(line: str) -> str:
    """The SHA256 fingerprint of a known_hosts line, as OpenSSH shows it.

    ``ED25519 key fingerprint is SHA256:...`` (unpadded base64 of the SHA-256 of the
    key blob), so it can be compared with ``ssh-keygen -lf`` run on the device.
    """
    fields = line.split()
    algo, blob = fields[1], fields[2]
    digest = hashlib.sha256(base64.b64decode(blob)).digest()
    kind = _KEY_KINDS.get(algo, algo.removeprefix("ssh-").upper())
    return f"{kind} key fingerprint is SHA256:{base64.b64encode(digest).decode().rstrip('=')}"


_KEY_KINDS = {"ssh-ed25519": "ED25519", "ssh-rsa": "RSA", "ssh-dss": "DSA"}
_KEY_KINDS.update({f"ecdsa-sha2-nistp{n}": "ECDSA" for n in (256, 384, 521)})


def fingerprints(lines: list[str]) -> list[str]:
    """SHA256 fingerprints (see :func:`fingerprint`) of known_hosts lines."""
    return [fingerprint(ln) for ln in lines]


def recorded_host_keys(device: Device) -> list[str]:
    """Lines recorded in tracr's known_hosts for this device's host and port."""
    path = device.known_hosts_file()
    if not path.exists():
        return []
    name = _known_hosts_name(device.host, device.port)
    return [ln for ln in path.read_text().splitlines() if ln.split(" ", 1)[0] == name]


def record_host_keys(device: Device, lines: list[str], *, replace: bool = False) -> None:
    """Add host-key lines for the device to its known_hosts file (``replace`` drops old ones)."""
    path = device.known_hosts_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    name = _known_hosts_name(device.host, device.port)
    old = path.read_text().splitlines() if path.exists() else []
    if replace:
        old = [ln for ln in old if ln.split(" ", 1)[0] != name]
    keep = set(old)
    new = old + [ln for ln in lines if ln not in keep]
    path.write_text("\n".join(new) + "\n")
    os.chmod(path, 0o600)


def ensure_key(path: Path) -> Path:
    """Generate an ed25519 key pair at ``path`` (no passphrase) unless it exists."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    cp = subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tracr", "-f", str(path)],
        capture_output=True, text=True,
    )  # fmt: skip
    if cp.returncode != 0:
        raise TracrError(f"ssh-keygen failed: {cp.stderr.strip()}")
    return path
