"""The clocks at either end of a timed region (no torch: the chain imports this)."""

from __future__ import annotations

import time

from experiment_design.runtime.procstat import cpu_wait_ns


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


def handoff_mark() -> tuple[int | None, int, int]:
    """At a compute's end: the thread's run-queue wait
    (:func:`~experiment_design.runtime.procstat.cpu_wait_ns`), its own CPU clock and its
    process's (ns), for :func:`handoff_wait` to read the hand-off by."""
    return cpu_wait_ns(), time.thread_time_ns(), time.process_time_ns()


def handoff_wait(rec: dict, same_thread: bool) -> None:
    """Just before a stage's send, what its hand-off (from the compute's end, marked by
    :func:`handoff_mark` in ``rec["handoff0"]``) spent, when the send runs on the
    compute's thread: ``rec["cpu_wait_ms"]``, the thread's run-queue wait (where the kernel
    keeps the figure), ``rec["handoff_cpu_ms"]``, the CPU time the thread itself ran, and
    ``rec["handoff_others_cpu_ms"]``, what the process's other threads ran meanwhile (one
    of them holding the interpreter's lock blocks the hand-off). The rest of the hand-off
    the thread was stopped (the lab's pacer) or blocked. The mark itself does not travel."""
    mark = rec.pop("handoff0", None)
    if not same_thread or mark is None:
        return
    w0, c0, p0 = mark
    mine = time.thread_time_ns() - c0
    rec["handoff_cpu_ms"] = mine / 1e6
    rec["handoff_others_cpu_ms"] = max(0, time.process_time_ns() - p0 - mine) / 1e6
    if w0 is not None and (w1 := cpu_wait_ns()) is not None:
        rec["cpu_wait_ms"] = (w1 - w0) / 1e6
