"""Taking the emulated lab down: everything it created, and only what it can prove is its own.

Every resource is recorded in the state file right after it is created
(:mod:`app_api.lab.lifecycle`), so :func:`down` undoes exactly what ``up`` did, even when
``up`` stopped half way. ``down`` also looks for leftovers by our unique names
(``tracr-lab-<n>`` namespaces, ``trlab-*`` links and cgroups), because the lab is one per
machine and a lost state file must not strand it.

``down`` runs as root, so it acts only on what it can prove is the lab's: a state whose
names or paths differ from what ``up`` generates is refused (and reported), processes
are stopped only inside our namespaces or when /proc shows our sshd with our config, and
in the user's directory only the files tracr writes there are removed, by name.
"""

from __future__ import annotations

import contextlib
import os
import shutil

from app_api import fsutil
from app_api.devices.registry import known_hosts_path
from app_api.lab import cgroup, links, network, pacer, sshd
from app_api.lab import memory as lab_memory
from app_api.lab import state as lab_state
from app_api.lab.registry_link import unregister_hosts
from app_api.lab.state import load_state, new_state, remove_state
from app_api.lab.system import require_root, stop_pid
from experiment_design.errors import TracrError


def down(*, say=lambda msg: None) -> dict:
    """Remove everything the lab created and can prove is its own (idempotent).

    Returns what was removed, by kind; ``removed["refused"]`` lists what was not trusted
    (a forged or tampered state file, an older version's state in the user's directory).
    """
    require_root()
    refused: list[str] = []
    try:
        state = load_state()
    except TracrError as exc:
        refused.append(str(exc))
        state = None  # unreadable: fall back to finding things by name
    if state is not None:
        problems = lab_state.validate_state(state, known_hosts_path())
        if problems:
            refused.append(
                f"the lab state file {lab_state.state_path()} is not what 'lab up' writes for "
                f"this user ({'; '.join(problems[:5])}{' ...' if len(problems) > 5 else ''}): "
                "a lab started with another TRACR_CONFIG_DIR, or a tampered file; it was "
                "ignored and only what is found by the lab's own names was removed"
            )
            state = None
    state = state or new_state()
    removed: dict[str, list] = {
        k: []
        for k in ("processes", "namespaces", "links", "cgroups", "registry", "known_hosts", "files")
    }

    namespaces = {h["ns"] for h in state["hosts"] if h.get("ns")} | set(network.list_namespaces())
    removed["processes"].extend(_stop_pacers(namespaces))
    removed["processes"].extend(links.stop_emulator(state))
    for h in state["hosts"]:
        pid = h.get("sshd_pid")
        if pid and _our_sshd(h) and stop_pid(pid):
            removed["processes"].append(pid)
    for ns in sorted(namespaces):
        # Only processes inside our own namespaces: sessions, participants, probes.
        for pid in network.ns_pids(ns):
            if stop_pid(pid, timeout=3.0):
                removed["processes"].append(pid)
    for ns in sorted(namespaces):
        if network.delete_namespace(ns):
            removed["namespaces"].append(ns)
    devices = {h.get("veth_host") for h in state["hosts"]} | set(network.list_links())
    devices.discard(None)
    for link in sorted(devices, key=lambda x: x == network.BRIDGE):  # bridge last
        if network.delete_link(link):
            removed["links"].append(link)
    if network.delete_link(network.BRIDGE):
        removed["links"].append(network.BRIDGE)

    groups = {h.get("cgroup") for h in state["hosts"] if h.get("cgroup")} | _our_cgroups()
    for path in sorted(groups):
        if cgroup.remove(path):
            removed["cgroups"].append(path)
    removed["cgroups"] += lab_memory.release(state)

    removed["registry"] = unregister_hosts(state)
    removed["known_hosts"] = _forget_host_keys(state, refused)
    removed["files"] = _remove_files(refused)
    removed["refused"] = refused
    for kind, items in removed.items():
        if items and kind != "refused":
            say(f"removed {kind}: {', '.join(map(str, items))}")
    return removed


def _stop_pacers(namespaces: set[str]) -> list[int]:
    """Stop the lab's pacer(s) and continue every process in ``namespaces`` (one may have
    been left stopped by a pacer that was killed)."""
    stopped = [p for p in pacer.find(lab_state.state_path()) if stop_pid(p, timeout=3.0)]
    pacer.continue_pids(sorted(p for ns in namespaces for p in network.ns_pids(ns)))
    return stopped


def _our_sshd(h: dict) -> bool:
    """True if host ``h``'s recorded sshd PID still is the sshd we started in its namespace
    (a reused PID, or a PID written into the state by someone else, is never killed)."""
    try:
        want = lab_state.expected_host(h.get("name"))
    except ValueError:
        return False
    pid = h.get("sshd_pid")
    return (
        h.get("ns") == want["ns"]
        and pid in network.ns_pids(want["ns"])
        and sshd.is_our_sshd(pid, want["sshd_config"], want["sshd_log"])
    )


def _forget_host_keys(state: dict, refused: list[str]) -> list[str]:
    """Drop the lab's host keys from tracr's known_hosts (recorded lines, else the subnet's)."""
    path = known_hosts_path()
    recorded = {line.split()[0] for line in state.get("known_hosts_lines") or []}
    subnet = {f"{network.SUBNET_PREFIX}.{i + 1}" for i in range(1, network.MAX_HOSTS + 1)}
    hosts = recorded or subnet
    try:
        if sshd.remove_known_hosts(path, hosts):
            return sorted(recorded) if recorded else [f"{network.SUBNET_PREFIX}.*"]
    except (OSError, TracrError) as exc:
        refused.append(f"could not edit {path}: {exc}")
    return []


def _remove_files(refused: list[str]) -> list[str]:
    """Remove the lab's root directory and, from the user's lab dir, only the files tracr
    writes there (by name; links are removed, never followed)."""
    removed: list[str] = []
    root = lab_state.lab_dir()
    if os.path.lexists(root):
        remove_state()
        if root.is_symlink():
            os.unlink(root)
        else:
            shutil.rmtree(root, ignore_errors=True)  # fd-based: links inside are not followed
        removed.append(str(root))
    user_dir = lab_state.client_dir()
    legacy = [p for p in lab_state.legacy_files() if os.path.lexists(p)]
    if any(p.name == "state.json" for p in legacy):
        refused.append(f"an older tracr's lab state {user_dir / 'state.json'} was not trusted "
                       "(it sits in a directory you can write); it was deleted")
    key = lab_state.client_key_path()
    for path in [key, key.with_name(key.name + ".pub"), *legacy]:
        if fsutil.unlink(path):
            removed.append(str(path))
    for sub in {p.parent for p in legacy if p.parent != user_dir}:
        with contextlib.suppress(OSError):
            os.rmdir(sub)
    with contextlib.suppress(OSError):
        if os.path.isdir(user_dir) and not os.path.islink(user_dir):
            os.rmdir(user_dir)  # only when empty: what else the user keeps there stays
            removed.append(str(user_dir))
    return removed


def _our_cgroups() -> set[str]:
    out: set[str] = set()
    for base in (cgroup.CGROUP_ROOT / "cpu", cgroup.CGROUP_ROOT):
        if base.is_dir():
            out |= {str(p) for p in base.glob(f"{network.NS_PREFIX}*") if p.is_dir()}
    return out
