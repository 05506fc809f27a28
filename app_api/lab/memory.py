"""Memory caps for lab hosts (``tracr lab up --memory lab-1=600MB``), with the cgroups v1
``memory`` controller.

A capped host's sshd is placed in a memory cgroup of its own, so every process started
over SSH on that host (participants included) shares the cap, as on a device with that
much memory: past it the kernel reclaims, then kills (the OOM killer) inside the host
alone. Swap is capped at the same figure where the kernel accounts it
(``memory.memsw.limit_in_bytes``), so a host cannot page its way past the cap.

The cgroups are made under this process's own memory cgroup (``/proc/self/cgroup``),
so a lab never escapes the limits it runs under.
"""

from __future__ import annotations

from pathlib import Path

from app_api.lab.cgroup import remove
from app_api.units import MIN_BYTES, parse_limits, parse_size  # noqa: F401 (re-exported)
from experiment_design.errors import TracrError

MEMORY_ROOT = Path("/sys/fs/cgroup/memory")


def base() -> Path:
    """This process's own memory cgroup, under which the hosts' cgroups are made."""
    if not (MEMORY_ROOT / "memory.limit_in_bytes").exists():
        raise TracrError("memory caps need the cgroups v1 memory controller, which is not "
                         f"mounted here ({MEMORY_ROOT})",
                         hint="drop --memory, or mount the memory controller")
    own = ""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            own = path.lstrip("/")
    return MEMORY_ROOT / own if own else MEMORY_ROOT


def create(ns: str, limit: int) -> Path:
    """Host ``ns``'s memory cgroup capped at ``limit`` bytes (swap included)."""
    path = base() / ns
    path.mkdir(exist_ok=True)
    (path / "memory.limit_in_bytes").write_text(str(int(limit)))
    memsw = path / "memory.memsw.limit_in_bytes"
    if memsw.exists():  # after the memory limit: the kernel wants memsw >= it
        memsw.write_text(str(int(limit)))
    return path


def add_pid(path: Path | str, pid: int) -> None:
    """Move ``pid`` into the cgroup at ``path`` (its future children follow)."""
    (Path(path) / "cgroup.procs").write_text(str(pid))


def read(path: Path | str) -> dict:
    """The cap and what the host used: ``limit_bytes``, ``max_usage_bytes`` (its peak),
    ``failcnt`` (times it hit the cap) and ``oom_kills`` (processes the kernel killed)."""
    path = Path(path)

    def num(name: str) -> int | None:
        try:
            return int((path / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    kills = None
    try:
        for line in (path / "memory.oom_control").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                kills = int(value)
    except (OSError, ValueError):
        pass
    return {"limit_bytes": num("memory.limit_in_bytes"),
            "max_usage_bytes": num("memory.max_usage_in_bytes"),
            "failcnt": num("memory.failcnt"), "oom_kills": kills}


def apply(state: dict, limits: dict[str, int], say=lambda msg: None) -> None:
    """Cap each host of ``state`` named in ``limits``: its sshd (started, no session
    yet) goes into a memory cgroup of its own; recorded in the host's state entry
    (``memory_cgroup``, ``memory_bytes``) for :func:`release`."""
    for h in state.get("hosts", []):
        limit = limits.get(h.get("name"))
        if limit is None:
            continue
        path = create(h["ns"], limit)
        h.update(memory_cgroup=str(path), memory_bytes=int(limit))
        if h.get("sshd_pid"):
            add_pid(path, int(h["sshd_pid"]))
        say(f"{h['name']}: memory capped at {limit / 1e6:.0f} MB")


def release(state: dict) -> list[str]:
    """Remove every host's memory cgroup (its processes must be gone); the paths
    removed."""
    removed = []
    for h in state.get("hosts", []):
        path = h.get("memory_cgroup")
        if path and remove(path):
            removed.append(path)
    return removed
