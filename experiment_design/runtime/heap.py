"""Keep Python's cyclic garbage collector out of the measurements.

CPython collects reference cycles when allocations outnumber deallocations by a
threshold, and a collection of the oldest generation walks every container object the
process holds. A participant holds hundreds of thousands: torch, the model, its traced
graph and the code generated for every cut (AlexNet with both sides built: 347,000
objects, and one full collection took 166-179 ms of CPU). Such a collection starts
whenever the counts say so, so it lands inside a measured inference: on three lab hosts
at 0.6 core, AlexNet's head stopped for 309-349 ms (inside a layer, or between two
inferences) once in every 32-inference throughput run, which ran at 36/s where 60/s
was planned and measured between the stops.

:func:`settle` collects once and then freezes what is left (``gc.freeze``: the objects
move to a generation no collection walks), at set-up and again before a task; a later
collection walks only what was made since. :class:`PauseWatch` times every collection
and logs the long ones, so a pause that still lands in a run is named in its log.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)

#: a collection at least this long is logged (ms of wall time)
LONG_PAUSE_MS = 5.0


_active = False


def activate() -> None:
    """Make this process one whose pauses matter: :func:`settle` acts and :data:`WATCH`
    times every collection. Only a participant (``experiment_design.participant``) and
    the lab's pacer call it: a frozen object is never collected, so freezing a process
    that builds and drops many models (a test run, a notebook) would keep every cycle
    among them for good."""
    global _active
    _active = True
    WATCH.install()


def active() -> bool:
    """True in a participant process (see :func:`activate`)."""
    return _active


def settle() -> dict | None:
    """In a participant (:func:`activate`), collect every generation, then freeze the
    survivors, and return ``{"frozen": objects now frozen, "tracked": objects left to
    collections, "collect_ms": the collection's wall time}``; elsewhere None."""
    if not _active:
        return None
    t0 = time.perf_counter()
    WATCH.armed = False  # this collection is ours, outside any measurement
    gc.collect()
    ms = (time.perf_counter() - t0) * 1e3
    gc.freeze()
    WATCH.armed = True
    return {"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects()),
            "collect_ms": round(ms, 1)}


class PauseWatch:
    """Times the garbage collections of this process (``gc.callbacks``) while ``armed``
    (from the first :func:`settle` on: the collections of imports and model building are
    not counted) and logs those of :data:`LONG_PAUSE_MS` or more; ``totals()`` says how
    many and how long by generation.

    Each collection is timed by the wall clock and by the collecting thread's CPU clock.
    Only the CPU time is the collection's own: on a host that a CPU quota or the lab's
    pacer stops for whole ticks, or beside a busier process, the wall time of a
    collection of a few microseconds can hold a stop (generation-0 collections were
    logged as pauses of 47 ms, 0 objects collected, on a lab host at 0.1 core, and of
    118 ms, 317 objects, on one paced at 0.25 core). A collection whose CPU time reaches
    :data:`LONG_PAUSE_MS` is a warning; one that was only long on the wall clock is said
    at INFO, with both figures."""

    def __init__(self, armed: bool = False) -> None:
        self.armed = armed
        self._start = 0.0
        self._cpu_start = 0
        self.count = [0, 0, 0]
        self.ms = [0.0, 0.0, 0.0]
        self.cpu_ms = [0.0, 0.0, 0.0]
        self.longest_ms = 0.0
        self.longest_cpu_ms = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if not self.armed:
            return
        if phase == "start":
            self._cpu_start = time.thread_time_ns()
            self._start = time.perf_counter()
            return
        ms = (time.perf_counter() - self._start) * 1e3
        cpu = (time.thread_time_ns() - self._cpu_start) / 1e6
        gen = min(int(info.get("generation", 0)), 2)
        self.count[gen] += 1
        self.ms[gen] += ms
        self.cpu_ms[gen] += cpu
        self.longest_ms = max(self.longest_ms, ms)
        self.longest_cpu_ms = max(self.longest_cpu_ms, cpu)
        if ms >= LONG_PAUSE_MS:
            level = logging.WARNING if cpu >= LONG_PAUSE_MS else logging.INFO
            log.log(level, "garbage collection (generation %d, %d objects collected) took "
                    "%.1f ms of CPU time and %.1f ms of wall time%s", gen,
                    int(info.get("collected", 0)), cpu, ms,
                    "" if level == logging.WARNING else
                    " (the rest: this thread held, stopped or waiting for a CPU)")

    def install(self) -> PauseWatch:
        """Add to ``gc.callbacks`` (once)."""
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self

    def totals(self) -> dict:
        """``{"collections": [gen0, gen1, gen2], "ms": [...], "longest_ms", "cpu_ms":
        [...], "longest_cpu_ms"}`` since the watch was armed (``ms``: wall time)."""
        return {"collections": list(self.count), "ms": [round(v, 2) for v in self.ms],
                "longest_ms": round(self.longest_ms, 2),
                "cpu_ms": [round(v, 2) for v in self.cpu_ms],
                "longest_cpu_ms": round(self.longest_cpu_ms, 2)}


#: the participant's watch (installed by ``experiment_design.participant``)
WATCH = PauseWatch()
