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
    many and how long by generation."""

    def __init__(self, armed: bool = False) -> None:
        self.armed = armed
        self._start = 0.0
        self.count = [0, 0, 0]
        self.ms = [0.0, 0.0, 0.0]
        self.longest_ms = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if not self.armed:
            return
        if phase == "start":
            self._start = time.perf_counter()
            return
        ms = (time.perf_counter() - self._start) * 1e3
        gen = min(int(info.get("generation", 0)), 2)
        self.count[gen] += 1
        self.ms[gen] += ms
        self.longest_ms = max(self.longest_ms, ms)
        if ms >= LONG_PAUSE_MS:
            log.warning("garbage collection (generation %d, %d objects collected) paused "
                        "this process %.1f ms", gen, int(info.get("collected", 0)), ms)

    def install(self) -> PauseWatch:
        """Add to ``gc.callbacks`` (once)."""
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self

    def totals(self) -> dict:
        """``{"collections": [gen0, gen1, gen2], "ms": [...], "longest_ms"}`` since the
        watch was armed."""
        return {"collections": list(self.count), "ms": [round(v, 2) for v in self.ms],
                "longest_ms": round(self.longest_ms, 2)}


#: the participant's watch (installed by ``experiment_design.participant``)
WATCH = PauseWatch()
