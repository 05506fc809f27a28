"""Pair a device: key pair, host key (shown and asked about), public key install, probe, save."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app_api.devices import ssh
from app_api.devices.probe import probe
from app_api.devices.registry import Device, DeviceRegistry, config_dir
from experiment_design.errors import TracrError


@dataclass
class PairRequest:
    """What the user asked for; ``None`` fields come from an existing entry or defaults."""

    name: str
    host: str | None = None
    user: str | None = None
    port: int | None = None
    key: str | None = None
    python: str | None = None
    data_host: str | None = None
    description: str | None = None
    tags: list[str] | None = None
    yes: bool = False
    rekey: bool = False
    accept_new_host_key: bool = False  # trust a device's first host key without asking
    password: str | None = None
    ask: Callable[[str], bool] | None = None  # yes/no question; None => non-interactive
    ask_password: Callable[[str], str] | None = None
    say: Callable[[str], None] = print


def default_key() -> Path:
    """The key tracr uses when none is given: the user's ed25519 key, else tracr's own."""
    user_key = Path.home() / ".ssh" / "id_ed25519"
    return user_key if user_key.exists() else config_dir() / "id_ed25519"


def _merge(req: PairRequest, reg: DeviceRegistry) -> Device:
    old = reg.get(req.name) if req.name in reg and req.name != "localhost" else None
    if req.host is None and old is None:
        raise TracrError(f"--host is required to pair the new device '{req.name}'.")

    def pick(value, attr, default):
        if value is not None:
            return value
        return getattr(old, attr) if old is not None else default

    dev = Device(
        name=req.name,
        host=pick(req.host, "host", None),
        user=pick(req.user, "user", os.environ.get("USER") or "root"),
        port=int(pick(req.port, "port", 22)),
        key=str(pick(req.key, "key", "")),
        python=pick(req.python, "python", "python3"),
        data_host=pick(req.data_host, "data_host", None),
        description=pick(req.description, "description", ""),
        tags=list(pick(req.tags, "tags", [])),
        known_hosts=old.known_hosts if old is not None else "",
    )
    dev.validate()
    return dev


def _ensure_key(dev: Device, req: PairRequest) -> Device:
    key = Path(dev.key).expanduser() if dev.key else default_key()
    if not key.exists():
        question = f"No SSH key at {key}. Create an ed25519 key pair there?"
        if not req.yes:
            if req.ask is None:
                raise TracrError(
                    f"no SSH key at {key}.",
                    hint="Pass --yes to let tracr create one, or --key PATH to use yours.",
                )
            if not req.ask(question):
                raise TracrError("pairing cancelled: no key.")
        ssh.ensure_key(key)
        req.say(f"created key pair {key} (+ .pub)")
    if not Path(str(key) + ".pub").exists():
        raise TracrError(
            f"public key {key}.pub is missing.", hint=f"ssh-keygen -y -f {key} > {key}.pub"
        )
    dev.key = str(key)
    return dev


def _record_host_key(dev: Device, req: PairRequest) -> None:
    """Check the device's host key against the recorded one; a new key is trusted only if asked.

    Runs before any login: the password (if one is needed) goes only to a host whose key
    the user accepted, because every later ssh checks it strictly.
    """
    scanned = ssh.keyscan(dev.host, dev.port)
    recorded = ssh.recorded_host_keys(dev)
    keyset = {ln.split(" ", 1)[1] for ln in scanned}
    where = f"{dev.host}:{dev.port}"
    if recorded and keyset & {ln.split(" ", 1)[1] for ln in recorded}:
        # Known and unchanged. Other key types the scan found are not added: nobody
        # was asked about them.
        for fp in ssh.fingerprints([ln for ln in scanned if ln in recorded] or recorded):
            req.say(f"host key of {where} (recorded): {fp}")
        return
    prints = ssh.fingerprints(scanned)
    if recorded:
        if not req.rekey:
            raise TracrError(
                f"host key for {dev.name} changed; if expected, run "
                f"`tracr device pair --name {dev.name} --rekey`",
                hint="A changed host key can mean a reinstall, or an attack; tracr will not connect.",
            )
        req.say(f"replacing the recorded host key of {dev.name} (--rekey)")
    else:
        req.say(f"the authenticity of host {where} can't be established.")
    for fp in prints:
        req.say(f"host key of {where}: {fp}")
    if not recorded and not (req.accept_new_host_key or req.rekey):
        _ask_to_trust(dev, req, where, prints)
    ssh.record_host_keys(dev, scanned, replace=True)


def _ask_to_trust(dev: Device, req: PairRequest, where: str, prints: list[str]) -> None:
    """Ask whether to trust a new host key (as OpenSSH does); non-interactive: refuse."""
    check = "Compare it with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on the device"
    if req.ask is None:
        raise TracrError(
            f"the host key of {dev.name} ({where}) is not known yet: {'; '.join(prints)}.",
            hint=f"{check}; if it matches, pair again with --accept-new-host-key "
            "(or run `tracr device pair` in a terminal to be asked).",
        )
    if not req.ask(f"{check}. Trust this host key and continue?"):
        raise TracrError(
            f"pairing cancelled: the host key of {dev.name} ({where}) was not trusted.",
            hint=f"Nothing was sent to {where}. {check}; pair again once it matches.",
        )


def _key_login_works(dev: Device) -> bool:
    cp = ssh.run_ssh(dev, "true", timeout=30, check=False)
    if cp.returncode == 0:
        return True
    status = ssh.classify_ssh_failure(cp.stderr.decode(errors="replace"))
    if status == ssh.LOGIN_FAILED:
        return False
    block = ssh.failure_block(
        ssh.ssh_argv(dev, "true"), dev.host, cp.returncode, "", cp.stderr.decode(errors="replace")
    )
    raise ssh.ssh_error(dev, status or ssh.UNREACHABLE, block)


def install_public_key(dev: Device, password: str) -> None:
    """Append the device's public key to ``~/.ssh/authorized_keys`` using a password login."""
    pub = Path(dev.key + ".pub").read_bytes()
    remote = (
        "umask 077; mkdir -p ~/.ssh && touch ~/.ssh/authorized_keys && "
        'k=$(cat) && (grep -qxF "$k" ~/.ssh/authorized_keys || printf \'%s\\n\' "$k" >> ~/.ssh/authorized_keys)'
    )
    opts = [o for o in ssh.ssh_options(dev, batch=False)]
    argv = [
        "ssh", *opts, "-o", "PubkeyAuthentication=no", "-o", "NumberOfPasswordPrompts=1",
        "-o", "PreferredAuthentications=password,keyboard-interactive", dev.target, remote,
    ]  # fmt: skip
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="tracr-askpass-") as tmp:
        if shutil.which("sshpass"):
            argv = ["sshpass", "-e", *argv]
            env["SSHPASS"] = password
        else:
            # OpenSSH >= 8.4 asks SSH_ASKPASS even without a display when forced.
            helper = Path(tmp) / "askpass"
            helper.write_text("#!/bin/sh\nprintf '%s\\n' \"$TRACR_SSH_PASSWORD\"\n")
            helper.chmod(0o700)
            env.update(SSH_ASKPASS=str(helper), SSH_ASKPASS_REQUIRE="force",
                       DISPLAY=env.get("DISPLAY", ":0"), TRACR_SSH_PASSWORD=password)  # fmt: skip
        cp = subprocess.run(argv, input=pub, capture_output=True, env=env, timeout=60,
                            start_new_session=True)  # fmt: skip
    if cp.returncode != 0:
        block = ssh.failure_block(argv[:-1] + ["<install key>"], dev.host, cp.returncode,
                                  cp.stdout.decode(errors="replace"), cp.stderr.decode(errors="replace"))  # fmt: skip
        raise TracrError(f"could not install the public key on {dev.name}\n{block}",
                         hint=copy_id_command(dev))  # fmt: skip


def copy_id_command(dev: Device) -> str:
    """The exact ssh-copy-id command that installs the device's key by hand."""
    kh = ssh.config_value(dev.known_hosts_file())
    return (
        f"ssh-copy-id -i {shlex.quote(dev.key)}.pub -p {dev.port} "
        f"-o {shlex.quote('UserKnownHostsFile=' + kh)} {dev.target}"
    )


def pair(req: PairRequest, registry: DeviceRegistry | None = None) -> Device:
    """Pair (or re-pair) a device and save it; returns the saved device."""
    reg = registry or DeviceRegistry.load()
    dev = _merge(req, reg)
    dev = _ensure_key(dev, req)
    if not ssh.tcp_reachable(dev.host, dev.port, timeout=5):
        raise TracrError(
            f"cannot reach {dev.host}:{dev.port} (TCP).",
            hint="Check the address, that the device is on and that sshd runs.",
        )
    _record_host_key(dev, req)
    if _key_login_works(dev):
        req.say(f"key login to {dev.target} works")
    else:
        password = req.password
        if password is None and req.ask_password is not None:
            password = req.ask_password(f"password for {dev.target} (used once, not stored): ")
        if not password:
            raise TracrError(
                f"the key is not installed on {dev.name} and no password was given.",
                hint=f"Install it yourself, then pair again:\n  {copy_id_command(dev)}",
            )
        install_public_key(dev, password)
        if not _key_login_works(dev):
            raise TracrError(f"key installed on {dev.name}, but key login still fails.",
                             hint="Check sshd's AuthorizedKeysFile and the permissions of ~/.ssh.")  # fmt: skip
        req.say(f"installed {dev.key}.pub on {dev.target}")
    dev.last_check = probe(dev)
    reg.add(dev)
    reg.save()
    return dev
