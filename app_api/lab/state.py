"""The lab's record of everything it created: ``$TRACR_CONFIG_DIR/lab/state.json``.

The file is rewritten after every resource is created, so ``tracr lab down`` can undo
a half-finished ``lab up`` (Ctrl-C, a failing command) from what is recorded.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from experiment_design.errors import TracrError

STATE_VERSION = 1


def config_dir() -> Path:
    """tracr's configuration directory (``$TRACR_CONFIG_DIR`` or ``~/.config/tracr``)."""
    env = os.environ.get("TRACR_CONFIG_DIR")
    return Path(env).expanduser() if env else Path.home() / ".config" / "tracr"


def lab_dir() -> Path:
    """Where the lab keeps its keys, sshd configs and state."""
    return config_dir() / "lab"


def state_path() -> Path:
    """Path of the lab's state file."""
    return lab_dir() / "state.json"


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
    """The recorded state, or None when no lab is up (no file)."""
    path = state_path()
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TracrError(
            f"the lab state file {path} is unreadable: {exc}",
            hint="run 'tracr lab down' to clean up what can be found by name",
        ) from exc
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        raise TracrError(
            f"the lab state file {path} has an unknown format",
            hint="run 'tracr lab down' to clean up what can be found by name",
        )
    base = new_state()
    base.update(data)
    return base


def save_state(state: dict) -> Path:
    """Write ``state`` atomically (temp file + rename) so a crash never leaves half a file."""
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path


def remove_state() -> bool:
    """Delete the state file; True if there was one."""
    path = state_path()
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


def host_entry(state: dict, name: str) -> dict:
    """The state's record for host ``name`` (created empty if missing)."""
    for host in state["hosts"]:
        if host.get("name") == name:
            return host
    host = {"name": name}
    state["hosts"].append(host)
    return host
