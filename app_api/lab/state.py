"""The lab's record of everything it created, and where the lab keeps its files.

Everything root trusts lives in a root-owned directory nobody else can write,
:data:`LAB_ROOT` (``/run/tracr-lab``; ``/run`` is emptied at boot, as the namespaces are)::

    /run/tracr-lab/             0755 root   state.json (0644: runs read the link report),
                                            link.lock (the shaping lock)
    /run/tracr-lab/sshd/        0700 root   authorized_keys, client_ed25519.pub
    /run/tracr-lab/sshd/lab-N/  0700 root   host key, sshd_config, sshd.pid, sshd.log

The only lab file in the user's ``$TRACR_CONFIG_DIR/lab`` is the observer's client key,
owned by the user who ran ``sudo``. Older tracr versions kept sshd's keys and the state
there (see :func:`legacy_files`); such a state is never trusted.

The state file is rewritten after every resource is created, so ``tracr lab down`` can
undo a half-finished ``lab up``. :func:`validate_state` checks every name and path in it
against what the lab generates, so a forged or tampered state is refused.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from app_api import fsutil
from app_api.lab import cgroup, network
from experiment_design.errors import TracrError

STATE_VERSION = 1
LAB_ROOT = Path("/run/tracr-lab")
CLIENT_KEY = "id_ed25519"
HOST_KEY = "ssh_host_ed25519_key"
_KNOWN_HOSTS_LINE = re.compile(
    rf"^{re.escape(network.SUBNET_PREFIX)}\.(\d{{1,3}}) ssh-ed25519 [A-Za-z0-9+/]+=*$"
)
_HOST_NAME = re.compile(r"^lab-([1-9][0-9]{0,2})$")


def config_dir() -> Path:
    """tracr's configuration directory (``$TRACR_CONFIG_DIR`` or ``~/.config/tracr``)."""
    env = os.environ.get("TRACR_CONFIG_DIR")
    return Path(env).expanduser() if env else Path.home() / ".config" / "tracr"


def lab_dir() -> Path:
    """The lab's root-owned directory (state, lock, sshd files)."""
    return LAB_ROOT


def sshd_dir() -> Path:
    """The root-only directory of sshd's keys and configs (0700)."""
    return LAB_ROOT / "sshd"


def host_dir(name: str) -> Path:
    """Where lab host ``name``'s sshd files live."""
    return sshd_dir() / name


def state_path() -> Path:
    """Path of the lab's state file."""
    return LAB_ROOT / "state.json"


def client_dir() -> Path:
    """The user's lab directory: only the observer's client key lives there."""
    return config_dir() / "lab"


def client_key_path() -> Path:
    """The observer's private key for logging in to the lab hosts (the user's, 0600)."""
    return client_dir() / CLIENT_KEY


def legacy_files() -> list[Path]:
    """Files older tracr versions kept in the user's lab dir (keys, configs, state)."""
    d = client_dir()
    found = [d / n for n in ("authorized_keys", "state.json", "state.json.tmp")]
    if d.is_dir() and not d.is_symlink():
        for sub in d.iterdir():
            if _HOST_NAME.match(sub.name) and sub.is_dir() and not sub.is_symlink():
                found += [sub / n for n in (HOST_KEY, HOST_KEY + ".pub", "sshd_config",
                                             "sshd.pid", "sshd.log")]
    return found


def ensure_lab_dirs() -> Path:
    """Create :data:`LAB_ROOT` and its sshd dir as root, refusing them if anyone else could
    write there (a directory planted before ``lab up``); return the sshd dir."""
    me = os.geteuid()
    LAB_ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
    sshd_dir().mkdir(mode=0o700, exist_ok=True)
    for d in (LAB_ROOT, sshd_dir()):
        if not fsutil.safe_dir(d, owners=(0, me)):
            raise TracrError(
                f"the lab directory {d} is not a directory owned by root and writable only "
                "by root; refusing to keep sshd's keys there",
                hint=f"remove it (sudo rm -r {d}) and run 'tracr lab up' again",
            )
    os.chmod(sshd_dir(), 0o700)
    return sshd_dir()


def new_state() -> dict:
    """An empty state: every list/dict the lab fills while it builds."""
    return {
        "version": STATE_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "bridge": None,
        "bridge_address": None,
        "subnet": None,
        "client_key": None,
        "known_hosts": None,
        "python": None,
        "hosts": [],
        "registry": [],
        "shaping": {},
        "measured": {},
        "complete": False,
    }


def load_state() -> dict | None:
    """The recorded state, or None when no lab is up (no file).

    The file must be a regular file (a link is not followed) owned by root (or by us).
    """
    path = state_path()
    try:
        text = fsutil.read_text(path)
        owner = os.lstat(path).st_uid if text is not None else None
    except (OSError, TracrError) as exc:
        raise TracrError(
            f"the lab state file {path} is unreadable: {exc}",
            hint="run 'sudo tracr lab down' to clean up what can be found by name",
        ) from exc
    if text is None:
        return None
    if owner not in (0, os.geteuid()):
        raise TracrError(
            f"the lab state file {path} is not root's (owner uid {owner}); it is not trusted",
            hint="run 'sudo tracr lab down' to clean up what can be found by name",
        )
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TracrError(
            f"the lab state file {path} is unreadable: {exc}",
            hint="run 'sudo tracr lab down' to clean up what can be found by name",
        ) from exc
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        raise TracrError(
            f"the lab state file {path} has an unknown format",
            hint="run 'sudo tracr lab down' to clean up what can be found by name",
        )
    base = new_state()
    base.update(data)
    return base


def save_state(state: dict) -> Path:
    """Write ``state`` atomically (temp + rename, no link followed), root-owned, 0644."""
    ensure_lab_dirs()
    text = json.dumps(state, indent=2, sort_keys=True)
    return fsutil.atomic_write(state_path(), text, mode=0o644, for_user=False)


def remove_state() -> bool:
    """Delete the state file (a link is removed, not followed); True if there was one."""
    return fsutil.unlink(state_path())


def host_entry(state: dict, name: str) -> dict:
    """The state's record for host ``name`` (created empty if missing)."""
    for host in state["hosts"]:
        if host.get("name") == name:
            return host
    host = {"name": name}
    state["hosts"].append(host)
    return host


def expected_host(name: str) -> dict:
    """Every name and path the lab generates for host ``name`` (``lab-<i>``)."""
    m = _HOST_NAME.match(name) if isinstance(name, str) else None
    if not m or int(m.group(1)) > network.MAX_HOSTS:
        raise ValueError(f"{name!r} is not a lab host name")
    names = network.host_names(int(m.group(1)))
    d = host_dir(name)
    return {
        **names,
        "dir": str(d),
        "host_key": str(d / HOST_KEY),
        "sshd_config": str(d / "sshd_config"),
        "sshd_log": str(d / "sshd.log"),
        "cgroups": {str(cgroup.CGROUP_ROOT / "cpu" / names["ns"]),
                    str(cgroup.CGROUP_ROOT / names["ns"])},
    }


def validate_state(state: dict, known_hosts: Path) -> list[str]:
    """What in ``state`` is not what ``lab up`` writes; [] for a state tracr could have made.

    Every namespace, link, path, cgroup, registry name and known_hosts line must be the
    one tracr generates for that host; anything else means the file was forged or
    tampered with, and ``lab down`` must not act on it.
    """
    problems: list[str] = []

    def bad(field: str, value) -> None:
        problems.append(f"{field} = {value!r}")

    for key, want in (("bridge", network.BRIDGE), ("bridge_address", network.BRIDGE_ADDRESS),
                      ("subnet", f"{network.SUBNET_PREFIX}.0/24")):
        if state.get(key) not in (None, want):
            bad(key, state.get(key))
    if state.get("client_key") not in (None, str(client_key_path())):
        bad("client_key", state.get("client_key"))
    if state.get("known_hosts") not in (None, str(known_hosts)):
        bad("known_hosts", state.get("known_hosts"))
    hosts = state.get("hosts")
    if not isinstance(hosts, list):
        bad("hosts", hosts)
        hosts = []
    addresses = set()
    for i, h in enumerate(hosts):
        if not isinstance(h, dict):
            bad(f"hosts[{i}]", h)
            continue
        try:
            want = expected_host(h.get("name"))
        except ValueError:
            bad(f"hosts[{i}].name", h.get("name"))
            continue
        addresses.add(want["address"])
        for key in ("ns", "address", "veth_host", "veth_ns", "veth_emu", "veth_bridge", "dir",
                    "host_key", "sshd_config"):
            if key in h and h[key] != want[key]:
                bad(f"hosts[{i}].{key}", h[key])
        if h.get("cgroup") is not None and h["cgroup"] not in want["cgroups"]:
            bad(f"hosts[{i}].cgroup", h["cgroup"])
        pid = h.get("sshd_pid")
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1):
            bad(f"hosts[{i}].sshd_pid", pid)
    for helper in ("pacer", "emulator"):
        entry = state.get(helper)
        if entry is not None:
            pid = entry.get("pid") if isinstance(entry, dict) else entry
            if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
                bad(f"{helper}.pid", pid)
    registry = state.get("registry") or []
    if not isinstance(registry, list):
        bad("registry", registry)
    else:
        for name in registry:
            if not (isinstance(name, str) and _HOST_NAME.match(name)):
                bad("registry[]", name)
    lines = state.get("known_hosts_lines") or []
    if not isinstance(lines, list):
        bad("known_hosts_lines", lines)
    else:
        for line in lines:
            m = _KNOWN_HOSTS_LINE.match(line) if isinstance(line, str) else None
            if not m or line.split()[0] not in addresses:
                bad("known_hosts_lines[]", line)
    return problems
