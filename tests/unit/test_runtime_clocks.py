"""A stage's clocks: the run-queue wait of a thread (experiment_design.runtime.clocks)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from experiment_design.runtime.clocks import cpu_wait_ns, handoff_mark, handoff_wait

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"),
                                reason="the kernel keeps no schedstat")


def test_a_thread_sharing_its_cpu_with_a_busy_process_waits_on_the_run_queue():
    """The figure the budget's ``cpu_wait_ms`` is made of: a thread pinned to the CPU a
    busy process is pinned to gets about half of it, and the other half it spends ready to
    run, waiting (here: at least a fifth of the wall time, whatever else runs)."""
    cpu = min(os.sched_getaffinity(0))
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nprint(flush=True)\nwhile True: pass"
    hog = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    before = os.sched_getaffinity(0)
    result: dict[str, float] = {}

    def spin() -> None:
        os.sched_setaffinity(0, {cpu})  # this thread only
        w0, t0 = cpu_wait_ns(), time.perf_counter()
        while time.perf_counter() - t0 < 0.4:
            pass
        result["wait"] = (cpu_wait_ns() - w0) / 1e9
        result["wall"] = time.perf_counter() - t0

    try:
        hog.stdout.readline()  # pinned and about to spin
        t = threading.Thread(target=spin)
        t.start()
        t.join()
    finally:
        hog.kill()
        hog.wait()
        hog.stdout.close()
    assert os.sched_getaffinity(0) == before  # the test's own thread was not pinned
    assert result["wait"] >= 0.2 * result["wall"], result


def test_each_thread_reads_its_own_wait_and_a_hand_off_records_it_only_on_one_thread():
    waits = []
    ts = [threading.Thread(target=lambda: waits.append(cpu_wait_ns())) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(waits) == 3 and all(isinstance(w, int) and w >= 0 for w in waits)
    rec = {"handoff0": handoff_mark()}
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.02:  # the hand-off's own work: 20 ms of CPU
        pass
    handoff_wait(rec, same_thread=True)
    assert "handoff0" not in rec and rec["cpu_wait_ms"] >= 0  # the mark does not travel
    assert rec["handoff_cpu_ms"] >= 20
    rec = {"handoff0": handoff_mark()}
    handoff_wait(rec, same_thread=False)  # throughput mode's send thread: not its wait
    assert rec == {}
    rec = {"handoff0": (None, time.thread_time_ns(), time.process_time_ns())}
    handoff_wait(rec, same_thread=True)  # no schedstat: the CPU clocks alone
    assert set(rec) == {"handoff_cpu_ms", "handoff_others_cpu_ms"}


def test_without_schedstat_the_wait_is_none_and_never_tried_again(monkeypatch, recwarn):
    """A kernel without ``/proc/thread-self/schedstat`` (or no ``/proc``: macOS): None,
    once, quietly (a file object that never opened closes nothing)."""
    from experiment_design.runtime import procstat

    monkeypatch.setattr(procstat, "_NO_SCHEDSTAT", [])
    opened = []

    def no_proc(path, *a, **k):
        opened.append(path)
        raise FileNotFoundError(path)

    monkeypatch.setattr(procstat.os, "open", no_proc)
    got = []
    t = threading.Thread(target=lambda: got.extend([cpu_wait_ns(), cpu_wait_ns()]))
    t.start()
    t.join()
    assert got == [None, None] and len(opened) == 1
