"""CPU quotas for lab hosts with cgroups (v1 ``cpu`` controller, or v2 ``cpu.max``).

A host's sshd is placed in its cgroup, so every process started over SSH on that host
(participants included) inherits the quota.
"""

from __future__ import annotations

import math
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from experiment_design.errors import TracrError

CGROUP_ROOT = Path("/sys/fs/cgroup")
# The CFS period of a lab host's quota. A short period makes a quota'd host behave like an
# evenly slower CPU (a Raspberry Pi) instead of one that runs at full speed and then stalls
# for most of a long period; ``tracr lab up --cpu-period-ms`` overrides it per lab.
PERIOD_US = 10_000
MIN_PERIOD_US = 1_000  # the kernel's limits for cpu.cfs_period_us / cpu.max
MAX_PERIOD_US = 1_000_000
MIN_QUOTA_US = 1_000  # the kernel refuses a smaller quota per period
# A host's CPU weight against the rest of the machine (the kernel's largest: v1
# ``cpu.shares``, v2 ``cpu.weight``). A host is meant to be a device of its own: what it
# asks for, up to its quota, it gets even while other work on the observer's machine is
# runnable on its CPU. At the default weight it shared that CPU with any other runnable
# task: a 0.6-core host got 0.50 of a core beside one busy loop on its CPU, and a paced
# 0.6-core host 0.47-0.50 in a full test suite with other tests running beside it. The
# quota still caps it.
HOST_SHARES_V1 = 262_144
HOST_WEIGHT_V2 = 10_000


def cgroup_version() -> int | None:
    """1 if the v1 ``cpu`` controller is mounted, 2 for a unified hierarchy with ``cpu``, else None."""
    if (CGROUP_ROOT / "cpu" / "cpu.cfs_quota_us").exists():
        return 1
    controllers = CGROUP_ROOT / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return 2
    return None


def cgroup_path(ns: str) -> Path:
    """Where host ``ns``'s cgroup lives for this machine's cgroup version."""
    version = cgroup_version()
    if version == 1:
        return CGROUP_ROOT / "cpu" / ns
    if version == 2:
        return CGROUP_ROOT / ns
    raise TracrError(
        "CPU quotas need the cgroup 'cpu' controller, which is not available here",
        hint="drop --cpu-quota, or mount the cpu controller (/sys/fs/cgroup/cpu or cgroup v2)",
    )


def period_us(period_ms: float | None = None) -> int:
    """The CFS period in microseconds for ``period_ms`` (None: the default, PERIOD_US)."""
    if period_ms is None:
        return PERIOD_US
    try:
        us = int(round(float(period_ms) * 1000))
    except (TypeError, ValueError) as exc:
        raise TracrError(f"the CPU period must be a number of ms, not {period_ms!r}") from exc
    if not MIN_PERIOD_US <= us <= MAX_PERIOD_US:
        raise TracrError(
            f"the CPU period must be between {MIN_PERIOD_US // 1000} and "
            f"{MAX_PERIOD_US // 1000} ms, not {period_ms}"
        )
    return us


def quota_us(fraction: float, period: int | None = None) -> int:
    """Quota per CFS period (``period`` us, default PERIOD_US) for a CPU fraction.

    Never rounded up to the kernel's 1 ms minimum: 0.6 core at a 1 ms period would become
    a whole core, and every figure measured on that host would be for the wrong machine.
    A fraction too small for the period is refused, naming the shortest period that fits.
    """
    if not fraction > 0:
        raise TracrError(f"a CPU quota must be a positive fraction of a core, not {fraction}")
    period = PERIOD_US if period is None else int(period)
    quota = int(round(fraction * period))
    if quota < MIN_QUOTA_US:
        raise TracrError(
            f"{fraction:g} core per {period / 1000:g} ms period is a {quota / 1000:g} ms quota, "
            f"below the kernel's {MIN_QUOTA_US // 1000} ms minimum",
            hint=f"use a period of at least {shortest_period_us(fraction) / 1000:g} ms "
            "(--cpu-period-ms), or a larger quota",
        )
    return quota


def shortest_period_us(fraction: float) -> int:
    """The shortest CFS period (us) at which ``fraction`` of a core is a valid quota."""
    if not fraction > 0:
        raise TracrError(f"a CPU quota must be a positive fraction of a core, not {fraction}")
    return max(MIN_PERIOD_US, math.ceil(MIN_QUOTA_US / fraction))


def host_period_us(fraction: float, period: int | None = None) -> int:
    """The period a host with ``fraction`` of a core gets when the lab asks for ``period``.

    ``None`` (no period asked for) is the default, PERIOD_US, lengthened for a fraction too
    small for it (0.05 core gets 20 ms, so its quota is exactly 1 ms); a period asked for is
    kept as it is (quota_us refuses a fraction that does not fit it).
    """
    if period is None:
        return max(PERIOD_US, shortest_period_us(fraction))
    return int(period)


def create(ns: str, fraction: float, period: int | None = None) -> Path:
    """Create host ``ns``'s cgroup with ``fraction`` of a CPU per ``period`` us and the
    largest CPU weight (:data:`HOST_SHARES_V1`); return its path."""
    period = host_period_us(fraction, period)
    path = cgroup_path(ns)
    path.mkdir(exist_ok=True)
    quota = quota_us(fraction, period)
    if cgroup_version() == 1:
        (path / "cpu.cfs_period_us").write_text(str(period))
        (path / "cpu.cfs_quota_us").write_text(str(quota))
        (path / "cpu.shares").write_text(str(HOST_SHARES_V1))
    else:
        (path / "cpu.max").write_text(f"{quota} {period}")
        (path / "cpu.weight").write_text(str(HOST_WEIGHT_V2))
    return path


def read_period_us(path: Path) -> int | None:
    """The CFS period configured in the cgroup at ``path`` (None if unreadable)."""
    try:
        if (path / "cpu.cfs_period_us").exists():
            return int((path / "cpu.cfs_period_us").read_text())
        return int((path / "cpu.max").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None


def add_pid(path: Path, pid: int) -> None:
    """Move process ``pid`` into the cgroup at ``path`` (its future children follow)."""
    (path / "cgroup.procs").write_text(str(pid))


def read_quota(path: Path) -> float | None:
    """The CPU fraction configured in the cgroup at ``path`` (None: unlimited or missing)."""
    try:
        if (path / "cpu.cfs_quota_us").exists():
            quota = int((path / "cpu.cfs_quota_us").read_text())
            period = int((path / "cpu.cfs_period_us").read_text())
        else:
            q, p = (path / "cpu.max").read_text().split()
            if q == "max":
                return None
            quota, period = int(q), int(p)
    except (OSError, ValueError):
        return None
    return None if quota < 0 else quota / period


def remove(path: Path | str | None) -> bool:
    """Remove a cgroup directory (its processes must be gone); True if it existed."""
    if not path:
        return False
    path = Path(path)
    for _ in range(50):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return False
        except OSError:
            # EBUSY while the last killed processes are still being reaped.
            time.sleep(0.05)
    return False


_BUSY = (
    "import sys,time\n"
    "sys.stdin.readline()\n"  # wait until the parent has moved us into the cgroup
    "w0=time.perf_counter(); c0=time.process_time()\n"
    "while time.perf_counter()-w0 < float(sys.argv[1]): pass\n"
    "print((time.process_time()-c0)/(time.perf_counter()-w0))\n"
)


def measure_share(path: Path, ns: str | None = None, seconds: float = 1.0) -> float:
    """CPU share a busy loop gets inside the cgroup at ``path`` (1.0 = one full core)."""
    return measure_shares([(path, ns)], seconds)[0]


def measure_shares(where: list[tuple[Path, str | None]], seconds: float = 1.0) -> list[float]:
    """CPU share a busy loop gets in each cgroup (path, network namespace) of ``where``,
    all of them running at once."""
    procs = []
    try:
        for path, ns in where:
            cmd = [sys.executable, "-I", "-c", _BUSY, str(seconds)]
            if ns:
                cmd = ["ip", "netns", "exec", ns, *cmd]
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True)
            procs.append(proc)
            add_pid(path, proc.pid)
        for proc in procs:  # every loop is in its cgroup: start them together
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outs = [proc.communicate(timeout=seconds + 30)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    shares = []
    for (path, _), out in zip(where, outs, strict=True):
        try:
            shares.append(float(out.strip().splitlines()[-1]))
        except (ValueError, IndexError) as exc:
            raise TracrError(f"the CPU quota check in {path} printed nothing useful") from exc
    return shares


#: appended to every :func:`run_pinned` child: once its work has printed, it ends at once.
#: Its interpreter's exit (torch's C++ destructors, malloc consolidating a large heap) is
#: no part of the measurement, and on a host paced at 0.25 core one benchmark worker spent
#: minutes and over 90 s of CPU time in it (`tracr bench preempt` in the full suite: 8.5
#: minutes for a test that takes 1), while the parent waited for the end of its stdout.
_EXIT_AT_ONCE = ("\nimport os as _os, sys as _sys\n"
                 "_sys.stdout.flush()\n_sys.stderr.flush()\n_os._exit(0)\n")


def run_pinned(code: str, args: list[str], cpu: int, cgroup_dir: Path | None = None,
               timeout: float = 600.0, what: str = "worker",
               place=lambda pid: None) -> str:
    """Run ``python -c code args`` pinned to ``cpu`` and, given ``cgroup_dir``, inside that
    cgroup. The child sets itself up (imports, its model), prints a line, then waits for
    one on stdin: it is placed (pinned, put in the cgroup, and ``place(pid)``: a scheduling
    policy, say) between the two, so its work runs placed and its set-up does not. Placed
    at once, as before, a worker imported torch at the quota it was to measure (a quarter
    of a core: four times as long). Returns the rest of its stdout; a failure raises with
    the end of its stderr."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen([sys.executable, "-c", code + _EXIT_AT_ONCE, *args],
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        if not select.select([proc.stdout], [], [], timeout)[0] or not proc.stdout.readline():
            proc.kill()
            _, err = proc.communicate()
            raise TracrError(f"the {what} did not set itself up: {err.strip()[-400:]}")
        os.sched_setaffinity(proc.pid, {cpu})
        if cgroup_dir is not None:
            (cgroup_dir / "cgroup.procs").write_text(str(proc.pid))
        place(proc.pid)
        out, err = proc.communicate("go\n", timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise TracrError(f"the {what} failed: {err.strip()[-400:]}")
    return out
