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
from experiment_design.split import build_split_model
sm = build_split_model("mobilenet_v2", seed=0)
x = torch.randn(1, 3, 224, 224)
head = ChainHead(types.SimpleNamespace(split_model=sm, instance="edge"))
whole = Route(("edge",), ())
print("ready", flush=True)  # set up outside the quota
sys.stdin.readline()  # in the cgroup now
with torch.inference_mode():
    for _ in range(3):
        head._compute(whole, x, -1)
    rows = []
    for i in range(60):
        time.sleep(0.02 + 0.01 * (i % 4) / 3)
        c = head._compute(whole, x, i)
        time.sleep(0.0001)  # the hand-off: the process gives up the CPU, as a send does
        # from the end stamp of the compute to the end of the hand-off
        rows.append([c.record["compute_ms"], c.record["cpu_ms"],
                     (time.perf_counter_ns() - c.record["t_end"]) / 1e6])
print(json.dumps({"computes": rows, "handoff": handoff(sm, x, [1, sm.n], 15, 0.02)}))
"""


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
    # collected the debt after the end: the hand-off that followed stalled for 7.5-10 ms
    # in 6 of 15 passes (mean over 3 ms), and a run booked that as transfer time. Now the
    # CPU clock is read first at both ends of the timed region. The work after a region
    # still gets only what the region left of the budget, so an occasional hand-off
    # stalls anyway, for the next period (8-10 ms): 11 of 270 passes here, 10 of 270 with
    # both CPUs busy; the defect stalled 6 of 15. The test counts the stalled hand-offs in
    # 60 passes and allows a fifth (the share a mean below 2 ms allowed in 30 before):
    # at 4% it fails about never, at the defect's 40% it passes with p < 0.001.
    rows = measured["computes"]
    stalls = [r[2] for r in rows]
    stalled = [s for s in stalls if s > 4.0]
    assert len(stalls) == 60 and len(stalled) <= 12, (
        f"hand-off after the timed compute, ms: {sorted(stalls)}")
    # the whole model is several quotas' worth of CPU: each compute waited for periods
    assert min(r[0] / r[1] for r in rows) > 1.5


def test_the_profile_measures_the_hand_off_stall_beyond_the_budget(measured):
    small, whole = measured["handoff"]
    assert small["split"] == 1 and whole["split"] > 1
    assert small["cpu_ms"] < 2.5 < whole["cpu_ms"]
    # a prefix inside its budget owes nothing; one well past it mostly does
    assert small["stall_ms"] < 1.0
    assert max(whole["samples"]) > 3.0 and whole["stall_ms"] > 1.0
    assert len(whole["samples"]) == 15
