"""The clocks at either end of a timed region (no torch: the chain imports this)."""

from __future__ import annotations

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
