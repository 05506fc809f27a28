"""The clocks at either end of a timed region (no torch: the chain imports this)."""

from __future__ import annotations

import os
import threading
import time


def clocks() -> tuple[int, int]:
    """``(wall ns, process CPU ns)`` at either end of a timed region; the CPU clock is read
    first.

    Reading a process's CPU clock makes the kernel account the time it has run, and under
    a CFS quota a process that has run past its budget (it may, until the next scheduler
    tick) is throttled right there, until the next period. Read first, that stall falls
    before the start stamp (it is the debt of what ran before) and before the end stamp
    (it is the debt of the region itself). Read after the wall clock, the region's debt
    was collected after its end, at whatever came next: an edge's hand-off to the link
    showed 0.31 ms of CPU and a median of 7.5 ms of wall time (0.25 core, 10 ms period).
    What the region leaves of the budget is still what the work after it gets: after a
    MobileNetV2 pass at 0.25 core, 6 of 15 hand-offs stalled with the old order, 0-2 of 15
    with this one (``tests/unit/test_quota_debt.py``).
    """
    cpu = time.process_time_ns()
    return time.perf_counter_ns(), cpu


class _Schedstat:
    """A thread's own ``schedstat`` file, open while the thread lives (its thread-local
    goes with the thread, and closes the file)."""

    __slots__ = ("fd",)

    def __init__(self) -> None:
        self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)

    def __del__(self) -> None:
        fd = getattr(self, "fd", None)  # None: the open failed (no /proc)
        if fd is not None:
            os.close(fd)


_SCHEDSTAT = threading.local()


def cpu_wait_ns() -> int | None:
    """The calling thread's run-queue wait so far, in ns: the time it was ready to run and
    waited for a CPU (the second field of ``/proc/thread-self/schedstat``, the kernel's
    scheduler clock); None where the kernel does not keep it (not Linux, no
    ``CONFIG_SCHED_INFO``).

    Two reads on one thread bound the wait between them: a stage reads it at the end of
    its compute and again just before its send, so the budget can tell a hand-off that
    waited for a CPU (lab hosts that share one, a busy machine) from time no timer
    explains. A read is a ``pread`` of a file the thread keeps open: about 1.5 us."""
    if _MISSING:
        return None
    f = getattr(_SCHEDSTAT, "file", None)
    try:
        if f is None:
            f = _SCHEDSTAT.file = _Schedstat()
        return int(os.pread(f.fd, 128, 0).split()[1])
    except (OSError, IndexError, ValueError):
        _MISSING.append(True)
        return None


#: not empty once a read failed: this kernel keeps no schedstat, and none is tried again
_MISSING: list[bool] = []


def handoff_mark() -> tuple[int | None, int, int]:
    """At a compute's end: the thread's run-queue wait, its own CPU clock and its
    process's (ns), for :func:`handoff_wait` to read the hand-off by."""
    return cpu_wait_ns(), time.thread_time_ns(), time.process_time_ns()


def handoff_wait(rec: dict, same_thread: bool) -> None:
    """Just before a stage's send, what its hand-off (from the compute's end, marked by
    :func:`handoff_mark` in ``rec["wait0"]``) spent, when the send runs on the compute's
    thread: ``rec["cpu_wait_ms"]``, the thread's run-queue wait (where the kernel keeps the
    figure), ``rec["handoff_cpu_ms"]``, the CPU time the thread itself ran, and
    ``rec["handoff_others_cpu_ms"]``, what the process's other threads ran meanwhile (one
    of them holding the interpreter's lock blocks the hand-off). The rest of
    the hand-off the thread was stopped or blocked (the lab's pacer, a lock, the
    interpreter's lock held by another thread). The mark itself does not travel."""
    mark = rec.pop("wait0", None)
    if not same_thread or mark is None:
        return
    w0, c0, p0 = mark
    mine = time.thread_time_ns() - c0
    rec["handoff_cpu_ms"] = mine / 1e6
    rec["handoff_others_cpu_ms"] = max(0, time.process_time_ns() - p0 - mine) / 1e6
    if w0 is not None and (w1 := cpu_wait_ns()) is not None:
        rec["cpu_wait_ms"] = (w1 - w0) / 1e6
