"""What a participant reads about its own process and machine, from /proc and sysfs.

Every reader takes the file-system ``root`` (tests pass a fake tree) and answers None
where its source is missing, so the sampler can say which source each figure came from
(``/proc``, ``psutil``, ``sysfs``, ``cpuinfo``) or that it had none. Nothing here
imports beyond the standard library: psutil is used only when /proc cannot be read (a
device that is not Linux) and only if installed.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path


def memory_kb(root: Path = Path("/")) -> tuple[int | None, int | None, str]:
    """``(VmRSS, VmHWM, source)`` of this process in kB: /proc/self/status, else psutil's
    RSS (no high-water mark there), else ``(None, None, "none")``."""
    try:
        text = (root / "proc/self/status").read_text()
    except OSError:
        try:
            import psutil
        except ImportError:
            return None, None, "none"
        return psutil.Process().memory_info().rss // 1024, None, "psutil"
    rss = hwm = None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1])
    return rss, hwm, "/proc"


def reset_peak(root: Path = Path("/")) -> bool:
    """Reset this process's RSS high-water mark (``5`` into /proc/self/clear_refs), so the
    next VmHWM is the peak since now; False where the kernel does not allow it."""
    try:
        with open(root / "proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def cpu_seconds() -> float:
    """User + system CPU time of this process (all its threads), in seconds."""
    t = os.times()
    return t.user + t.system


def _cgroup_dirs(root: Path) -> list[Path]:
    """This process's cpu cgroup directories, from its leaf up to the hierarchy's root."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    out: list[Path] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, path = parts
        if ctrls == "":
            bases = [root / "sys/fs/cgroup", root / "sys/fs/cgroup/unified"]
        elif "cpu" in ctrls.split(","):
            bases = [root / "sys/fs/cgroup" / ctrls, root / "sys/fs/cgroup/cpu",
                     root / "sys/fs/cgroup/cpu,cpuacct"]
        else:
            continue
        for base in bases:
            if not (base / "cpu.stat").exists():
                continue
            rel = Path(path.strip("/"))
            while True:
                d = base / rel
                if (d / "cpu.stat").exists():
                    out.append(d)
                if rel == Path("."):
                    break
                rel = rel.parent
            break
    return out


def _has_quota(d: Path) -> bool:
    try:
        if (d / "cpu.max").exists():
            return (d / "cpu.max").read_text().split()[0] != "max"
        if (d / "cpu.cfs_quota_us").exists():
            return int((d / "cpu.cfs_quota_us").read_text()) > 0
    except (OSError, ValueError, IndexError):
        pass
    return False


def throttle_file(root: Path = Path("/")) -> Path | None:
    """The ``cpu.stat`` whose throttling limits this process: the nearest cgroup on its
    path with a CFS quota, else its own; None without a readable cpu cgroup."""
    dirs = _cgroup_dirs(root)
    if not dirs:
        return None
    limited = [d for d in dirs if _has_quota(d)]
    return (limited[0] if limited else dirs[0]) / "cpu.stat"


def throttled(path: Path | None) -> tuple[int | None, float | None]:
    """``(nr_throttled, throttled microseconds)`` from a cgroup v2 or v1 ``cpu.stat``."""
    if path is None:
        return None, None
    try:
        fields = dict(line.split() for line in path.read_text().splitlines() if line.strip())
    except (OSError, ValueError):
        return None, None
    n = int(fields["nr_throttled"]) if "nr_throttled" in fields else None
    if "throttled_usec" in fields:  # v2
        return n, float(fields["throttled_usec"])
    if "throttled_time" in fields:  # v1: nanoseconds
        return n, int(fields["throttled_time"]) / 1e3
    return n, None


@dataclass
class FrequencySource:
    """Where CPU frequencies are read: per-CPU ``scaling_cur_freq`` (kHz) in sysfs, else
    the ``cpu MHz`` lines of /proc/cpuinfo (often a nominal figure in a VM)."""

    files: list[Path]
    cpuinfo: Path | None

    @property
    def name(self) -> str:
        """``sysfs``, ``cpuinfo`` or ``none``."""
        return "sysfs" if self.files else ("cpuinfo" if self.cpuinfo else "none")

    def mhz(self) -> float | None:
        """Mean frequency of this process's CPUs now, in MHz."""
        vals: list[float] = []
        if self.files:
            for f in self.files:
                try:
                    vals.append(int(f.read_text()) / 1e3)
                except (OSError, ValueError):
                    pass
        elif self.cpuinfo is not None:
            try:
                for line in self.cpuinfo.read_text().splitlines():
                    if line.startswith("cpu MHz"):
                        vals.append(float(line.split(":")[1]))
            except (OSError, ValueError):
                pass
        return sum(vals) / len(vals) if vals else None


def frequency_source(root: Path = Path("/")) -> FrequencySource:
    """The frequency files of the CPUs this process may run on."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = list(range(os.cpu_count() or 1))
    files = [root / f"sys/devices/system/cpu/cpu{c}/cpufreq/scaling_cur_freq" for c in cpus]
    files = [f for f in files if f.exists()]
    cpuinfo = root / "proc/cpuinfo"
    return FrequencySource(files, cpuinfo if cpuinfo.exists() else None)


class OpenFiles:
    """The files a sampler reads at every sample, opened once and re-read with ``pread``:
    one system call per file and little Python, so the sampler holds the interpreter lock
    (which the inference thread needs between layers) for as short a time as it can."""

    def __init__(self, root: Path = Path("/"), throttle: Path | None = None,
                 reset: bool = True) -> None:
        self.status = _open(root / "proc/self/status", os.O_RDONLY)
        self.clear = _open(root / "proc/self/clear_refs", os.O_WRONLY) if reset else None
        self.cpu_stat = _open(throttle, os.O_RDONLY) if throttle is not None else None
        self.stat = _open(root / "proc/stat", os.O_RDONLY)

    def memory_kb(self) -> tuple[int | None, int | None]:
        """(VmRSS, VmHWM) in kB, then the high-water mark reset where allowed."""
        if self.status is None:
            return None, None
        text = os.pread(self.status, 4096, 0)
        out = (_field(text, b"VmRSS:"), _field(text, b"VmHWM:"))
        if self.clear is not None:
            try:
                os.write(self.clear, b"5")
            except OSError:
                os.close(self.clear)
                self.clear = None
        return out

    @property
    def resets(self) -> bool:
        """The high-water mark is reset at every read."""
        return self.clear is not None

    def throttled(self) -> tuple[int | None, float | None]:
        """``(nr_throttled, throttled microseconds)``, as :func:`throttled` reads them."""
        if self.cpu_stat is None:
            return None, None
        text = os.pread(self.cpu_stat, 4096, 0)
        n = _field(text, b"nr_throttled ")
        us = _field(text, b"throttled_usec ")
        if us is None:
            ns = _field(text, b"throttled_time ")
            return n, (ns / 1e3 if ns is not None else None)
        return n, float(us)

    def machine_jiffies(self) -> tuple[int, int] | None:
        """(busy, total) CPU time of the whole machine since boot, in clock ticks, from
        /proc/stat's first line; a virtual machine's steal time is in neither."""
        if self.stat is None:
            return None
        line = os.pread(self.stat, 256, 0).split(b"\n", 1)[0].split()
        user, nice, system, idle, iowait, irq, softirq = (int(v) for v in line[1:8])
        busy = user + nice + system + irq + softirq
        return busy, busy + idle + iowait

    def close(self) -> None:
        """Close every file."""
        for fd in (self.status, self.clear, self.cpu_stat, self.stat):
            if fd is not None:
                os.close(fd)
        self.status = self.clear = self.cpu_stat = self.stat = None


class _ThreadSchedstat:
    """A thread's own ``schedstat`` file, open while the thread lives (its thread-local
    goes with the thread, and closes the file); ``fd`` None where it cannot be opened."""

    __slots__ = ("fd",)

    def __init__(self) -> None:
        self.fd = _open(Path("/proc/thread-self/schedstat"), os.O_RDONLY)

    def __del__(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


_SCHEDSTAT = threading.local()
#: not empty once a read failed: this kernel keeps no schedstat, and none is tried again
_NO_SCHEDSTAT: list[bool] = []


def cpu_wait_ns() -> int | None:
    """The calling thread's run-queue wait so far, in ns: the time it was ready to run and
    waited for a CPU (the second field of ``/proc/thread-self/schedstat``, the kernel's
    scheduler clock); None where the kernel does not keep it (not Linux, no
    ``CONFIG_SCHED_INFO``).

    Two reads on one thread bound the wait between them: a stage reads it at the end of
    its compute and again just before its send, so the budget can tell a hand-off that
    waited for a CPU (lab hosts that share one, a busy machine) from time no timer
    explains. A read is a ``pread`` of a file the thread keeps open: about 1.5 us."""
    if _NO_SCHEDSTAT:
        return None
    f = getattr(_SCHEDSTAT, "file", None)
    if f is None:
        f = _SCHEDSTAT.file = _ThreadSchedstat()
    try:
        return int(os.pread(f.fd, 128, 0).split()[1])
    except (OSError, TypeError, IndexError, ValueError):  # TypeError: fd None
        _NO_SCHEDSTAT.append(True)
        return None


def _open(path: Path, flags: int) -> int | None:
    try:
        return os.open(path, flags)
    except OSError:
        return None


def _field(text: bytes, key: bytes) -> int | None:
    """The integer after ``key`` at a line's start in ``text`` (None when absent)."""
    i = text.find(b"\n" + key)
    i = i + 1 if i >= 0 else (0 if text.startswith(key) else -1)
    if i < 0:
        return None
    end = text.find(b"\n", i)
    return int(text[i + len(key):end if end >= 0 else None].split()[0])
