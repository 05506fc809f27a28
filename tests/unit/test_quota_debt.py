"""Under a CFS quota a process may run past its budget until the next scheduler tick; the
kernel collects that debt the next time it accounts the process's time (a read of its CPU
clock, a blocking send or receive) by throttling it until a later period. These tests run
a real MobileNetV2 prefix in a real cgroup (0.25 core, 10 ms) and check where that stall
lands: inside the edge's timed compute (its cost), not after it in the hand-off to the
link, and that the start-up profile measures it for the predictor."""

from __future__ import annotations

import json
import os

import pytest

from app_api.lab import cgroup

pytestmark = pytest.mark.slow  # a real model in a real cgroup: 10-25 s

_CHILD = r"""
import json, sys, time, types
import torch
torch.set_num_threads(1)
from experiment_design.runtime import allocator
allocator.configure("steady")
from experiment_design.roles.profiling import handoff
from experiment_design.runtime.chain import ChainHead, Route
from experiment_design.runtime.route import run_range
from experiment_design.split import build_split_model
sm = build_split_model("mobilenet_v2", seed=0)
x = torch.randn(1, 3, 224, 224)
head = ChainHead(types.SimpleNamespace(split_model=sm, instance="edge"))
whole = Route(("edge",), ())


def before_the_fix(x):
    # the same pass, its end stamped before its CPU clock is read (the order before the fix)
    t0 = time.perf_counter_ns(); c0 = time.process_time_ns()
    out, layers = run_range(sm, 0, sm.n, {sm.points[0].crossing[0]: x}, timed=True, last=True)
    t1 = time.perf_counter_ns(); c1 = time.process_time_ns()
    return {"t_end": t1, "compute_ms": (t1 - t0) / 1e6, "cpu_ms": (c1 - c0) / 1e6,
            "layers": [[int(i), float(ms)] for i, ms in layers]}


print("ready", flush=True)  # set up outside the quota
sys.stdin.readline()  # in the cgroup now
rows = {"fixed": [], "before": []}
with torch.inference_mode():
    for _ in range(3):
        head._compute(whole, x, -1)
    for i in range(2 * PASSES):
        time.sleep(0.02 + 0.01 * (i % 4) / 3)
        if i % 2 == 0:
            key, rec = "fixed", head._compute(whole, x, i).record
        else:
            key, rec = "before", before_the_fix(x)
        # the next read of the CPU clock after the end stamp collects any debt the compute
        # left: the time from that stamp to just after the read is that debt's stall
        time.process_time_ns()
        debt = (time.perf_counter_ns() - rec["t_end"]) / 1e6
        time.sleep(0.0001)  # the hand-off: the process gives up the CPU, as a send does
        # from the end stamp of the compute to the end of the hand-off
        rows[key].append([rec["compute_ms"], rec["cpu_ms"],
                          (time.perf_counter_ns() - rec["t_end"]) / 1e6, debt])
print(json.dumps({**rows, "handoff": handoff(sm, x, [1, sm.n], 15, 0.02)}))
""".replace("PASSES", "50")


def _run_in_quota() -> dict:
    path = cgroup.create(f"tracr-test-debt-{os.getpid()}", 0.25, 10_000)
    try:
        out = cgroup.run_pinned(_CHILD, [], max(os.sched_getaffinity(0)), path, timeout=300)
        return json.loads(out.strip().splitlines()[-1])
    finally:
        cgroup.remove(path)


@pytest.fixture(scope="module")
def measured() -> dict:
    if os.geteuid() != 0 or cgroup.cgroup_version() is None:
        pytest.skip("a CPU quota needs root and the cgroup cpu controller")
    return _run_in_quota()


def test_the_quota_debt_of_a_timed_compute_is_paid_inside_it(measured):
    # Regression: the compute's end was stamped before its CPU clock was read, so the read
    # collected the debt after the end: the hand-off that followed stalled for the next
    # period (7-10 ms), and a run booked that as transfer time. Now the CPU clock is read
    # first at both ends of the timed region. The child times the same pass both ways,
    # interleaved, in the same conditions, and reads the CPU clock again right after each
    # (the first thing a hand-off does that accounts the process's time): the stall from
    # the end stamp to just after that read is the debt the compute left outside itself.
    # Only a few microseconds of work lie between the two, so the figure does not move
    # with how fast the machine runs the hand-off's own work. That work still gets only
    # what the compute left of the budget, so the whole hand-off stalls now and then in
    # either order (4-6 of 60 alone; 20-24 of 50 on a day the machine ran the quota'd
    # work 2-4x slower, its hand-offs 0.9-1.7 ms against 0.3): it is reported, not tested.
    # On the code before the fix both orders are the old one and stall alike.
    fixed = [r[3] for r in measured["fixed"]]
    before = [r[3] for r in measured["before"]]
    stalled, stalled_before = (sum(1 for s in v if s > 4.0) for v in (fixed, before))
    hand = {k: sorted(round(r[2], 2) for r in measured[k]) for k in ("fixed", "before")}
    assert len(fixed) == len(before) == 50
    assert stalled_before >= 15, f"the old order stalled {stalled_before} of 50: {sorted(before)}"
    assert 2 * stalled <= stalled_before, (
        f"stall after the timed compute, ms: {sorted(fixed)}; in the old order: {sorted(before)};"
        f" whole hand-offs: {hand}")
    # the whole model is several quotas' worth of CPU: each compute waited for periods
    assert min(r[0] / r[1] for r in measured["fixed"]) > 1.5


def test_the_profile_measures_the_hand_off_stall_beyond_the_budget(measured):
    small, whole = measured["handoff"]
    assert small["split"] == 1 and whole["split"] > 1
    assert small["cpu_ms"] < 2.5 < whole["cpu_ms"]
    # a prefix inside its budget owes nothing; one well past it mostly does
    assert small["stall_ms"] < 1.0
    assert max(whole["samples"]) > 3.0 and whole["stall_ms"] > 1.0
    assert len(whole["samples"]) == 15
