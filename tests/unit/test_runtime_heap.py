"""The participant's heap: frozen after set-up, so no collection walks the model again."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiment_design.runtime import heap

REPO = Path(__file__).resolve().parents[2]

# a participant's set-up path in a process of its own: the edge role sets up AlexNet
# (both engines' code for every cut built), then a full collection is timed in CPU time
_SETUP = r"""
import gc, json, os, sys, time
import torch
torch.set_num_threads(1)
from experiment_design.runtime import heap
if sys.argv[1] == "participant":
    heap.activate()
from experiment_design.roles import get_role
edge = get_role("edge")(instance="edge-1")
edge.exposed_setup(json.dumps({
    "instance": "edge-1", "seed": 0, "threads": 1, "data_secret": os.urandom(32).hex(),
    "model": {"name": "alexnet", "weights": None, "depth": None, "mode": "auto", "batch": 1},
    "dataset": {"name": "synthetic", "params": {"size": 2}},
    "transport": {"codec": "zstd", "level": 1, "filter": "shuffle"},
    "partitioner": {"name": "cyclic", "params": {"repeats": 1}}}))
t0 = time.process_time()
gc.collect()
print(json.dumps({"collect_cpu_ms": (time.process_time() - t0) * 1e3,
                  "frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())}))
"""


def _setup(kind: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _SETUP, kind], cwd=REPO, capture_output=True,
                         text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_participant_freezes_its_heap_after_set_up_and_collections_stay_short():
    # On three lab hosts at 0.6 core, AlexNet's head stopped 309-349 ms once per
    # 32-inference throughput run: a full collection walked its 347,000 objects (166-179
    # ms of CPU). Settled, a collection walks only what was made since the set-up.
    before = _setup("plain")
    after = _setup("participant")
    assert before["frozen"] == 0 and before["tracked"] > 100_000
    assert after["frozen"] > 100_000 and after["tracked"] < after["frozen"] / 20
    assert after["collect_cpu_ms"] < before["collect_cpu_ms"] / 5, (before, after)


def test_settle_does_nothing_outside_a_participant():
    # a frozen object is never collected: a test process or a notebook must not freeze
    assert not heap.active() and heap.settle() is None and gc.get_freeze_count() == 0


def test_the_watch_times_collections_and_logs_the_long_ones(caplog):
    caplog.set_level("INFO", logger=heap.__name__)
    watch = heap.PauseWatch()
    watch("start", {"generation": 2})  # not armed (start-up): not counted
    watch("stop", {"generation": 2, "collected": 3})
    assert watch.count == [0, 0, 0]
    watch.armed = True
    watch("start", {"generation": 2})
    watch("stop", {"generation": 2, "collected": 3})
    assert watch.count == [0, 0, 1] and watch.totals()["longest_ms"] >= 0
    watch._start -= 0.010  # a collection that took 10 ms of wall time, no CPU time
    watch("stop", {"generation": 1, "collected": 0})
    assert watch.count == [0, 1, 1] and watch.longest_ms >= 10
    assert "took" in caplog.text and watch.longest_cpu_ms < 5


class _Finalized:
    """Garbage in a reference cycle whose finalizer, run by the collector, either sleeps
    (the collecting thread off its CPU: what a host stopped by a quota or the lab's pacer
    looks like from inside) or computes."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.me = self  # a cycle: only the cyclic collector frees it

    def __del__(self) -> None:
        if self.how == "sleep":
            time.sleep(0.030)
        else:  # 30 ms of this thread's CPU time, however long a busy machine makes that
            c0 = time.thread_time()
            while time.thread_time() - c0 < 0.030:
                pass


@pytest.mark.parametrize("how", ["sleep", "compute"])
def test_a_collection_is_blamed_for_its_cpu_time_not_its_wall_time(how, caplog):
    """A real collection that took 30 ms of wall time: a warning only where the collector
    used the CPU for it. A lab host at 0.1 core logged a generation-0 collection of 0
    objects as a 47 ms pause of the process: the quota's stall, not the collection."""
    import gc
    import logging

    watch = heap.PauseWatch(armed=True)
    gc.callbacks.append(watch)
    try:
        _Finalized(how)
        with caplog.at_level(logging.INFO, logger=heap.__name__):
            gc.collect(0)  # the youngest generation: the cycle, not the test process's heap
    finally:
        gc.callbacks.remove(watch)
    assert watch.longest_ms >= 30
    records = [r for r in caplog.records if "garbage collection" in r.getMessage()]
    assert records, caplog.text
    if how == "sleep":
        assert watch.longest_cpu_ms < 5
        assert all(r.levelno == logging.INFO for r in records), caplog.text
    else:
        assert watch.longest_cpu_ms >= 25
        assert any(r.levelno == logging.WARNING for r in records), caplog.text
