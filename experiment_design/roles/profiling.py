"""Start-up profiling of a participant: what the predictive partitioners learn from.

Runs on the device, so it imports only torch and the standard library.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from experiment_design.partitioners.predicted import prefix_cpu_of
from experiment_design.runtime.clocks import clocks


def profile_split_model(
    sm: Any,
    x: Any,
    *,
    repeats: int = 5,
    warmup: int = 1,
    full_repeats: int = 5,
    cold_repeats: int = 7,
    cold_gap_ms: float | None = None,
    device: str = "cpu",
    quota: dict | None = None,
) -> dict:
    """Profile ``sm`` (a SplitModel) on input ``x``.

    ``layers``: the median ms of each layer over ``repeats`` timed full passes, measured in
    the context of the whole model; ``layers_min``: each layer's fastest run (contention and
    quota stalls only ever add time, so the minimum is the best estimate of a layer's share
    of the CPU work); ``full_ms`` / ``full_cpu_ms``: the median wall and CPU time of
    ``full_repeats`` untimed full passes (what a whole pass really costs here, quota stalls
    included); ``cpu_quota``: the CFS limit this process sees itself under, or None
    (``quota``, when given, stands in for it where this process cannot see its own).

    ``prefix_cold_ms``: the median wall time from the start of a pass to the end of each
    layer k, over ``cold_repeats`` timed passes that each start after an idle gap of
    ``cold_gap_ms`` (default: two CFS periods, at least 20 ms) plus a random jitter. That is
    the regime an edge prefix runs in during an experiment (it waits for the transfer and
    the cloud between inferences), and under a CPU quota it is not the sum of per-layer
    medians: a pass after an idle spell starts with a full budget and stalls where the
    budget runs out, which back-to-back passes place elsewhere.

    ``handoff`` (under a CPU quota only, see :func:`handoff`): the stall that follows a
    prefix when the process gives up the CPU to send, for a few prefixes.

    ``layers_cpu`` (under a CPU quota or the lab's pacer, on a CPU): the median CPU ms of
    each layer over ``repeats`` passes timed with the process's CPU clock.
    """
    import torch

    with torch.inference_mode():
        for _ in range(max(0, warmup)):
            sm.run_full(x, timed=True)
        per = _per_layer(sm.run_full(x, timed=True)[1] for _ in range(max(1, repeats)))
    layers = {str(k): statistics.median(v) for k, v in sorted(per.items())}
    prof: dict[str, Any] = {
        "layers": layers,
        "layers_min": {str(k): min(v) for k, v in sorted(per.items())},
        "total_ms": sum(layers.values()),
        "repeats": max(1, repeats),
        "threads": torch.get_num_threads(),
    }
    sync = torch.cuda.synchronize if device.startswith("cuda") else None
    walls, cpus = [], []
    with torch.inference_mode():
        for _ in range(max(0, full_repeats)):
            if sync:
                sync()
            t0, c0 = clocks()
            sm.run_full(x)
            if sync:
                sync()
            t1, c1 = clocks()
            walls.append((t1 - t0) / 1e6)
            cpus.append((c1 - c0) / 1e6)
    if walls:
        # CPU time is what a CPU quota is charged; a busy neighbour or a throttling
        # stall does not inflate it the way it inflates wall time
        prof.update(
            full_ms=statistics.median(walls),
            full_repeats=len(walls),
            full_ms_min=min(walls),
            full_ms_max=max(walls),
            full_cpu_ms=statistics.median(cpus),
        )
    seen = cpu_quota()
    prof["cpu_quota"] = seen
    quota = seen or quota
    if quota and not sync:
        # the work's shape on a host whose wall time a quota or the lab's pacer stretches:
        # each layer's CPU time (its wall time has the stalls and stops in it, which the
        # fastest run cannot take out of a layer longer than the pacer's tick)
        with torch.inference_mode():
            cpu_per = _per_layer(sm.run_full(x, timed="cpu")[1] for _ in range(max(1, repeats)))
        prof["layers_cpu"] = {str(k): statistics.median(v) for k, v in sorted(cpu_per.items())}
    if cold_repeats > 0:
        gap = cold_gap_ms if cold_gap_ms is not None else cold_gap_for(
            (quota or {}).get("period_ms"))
        prof.update(prefix_cold_ms=cold_prefix(sm, x, cold_repeats, gap / 1000.0, sync),
                    cold_gap_ms=gap, cold_repeats=cold_repeats)
        if quota and not sync:
            prof["handoff"] = handoff(sm, x, handoff_points(sm, prof, quota),
                                      max(9, cold_repeats), gap / 1000.0)
    return prof


def _per_layer(runs) -> dict[int, list[float]]:
    """Each layer's ms over timed passes (``runs``: their ``[(index, ms), ...]``)."""
    per: dict[int, list[float]] = {}
    for one in runs:
        for idx, ms in one:
            per.setdefault(int(idx), []).append(float(ms))
    return per


def cold_gap_for(period_ms: float | None) -> float:
    """Idle gap (ms) before each cold pass: two CFS periods, so the quota has refilled
    whatever the phase, and never under 20 ms."""
    return max(20.0, 2 * float(period_ms or 0.0))


def cold_prefix(sm: Any, x: Any, repeats: int, gap_s: float, sync: Any = None) -> dict:
    """``{"k": ms}``: median wall time from a pass's start to the end of layer k, each pass
    run after an idle ``gap_s`` (plus up to half of it again, at random, so the passes
    start at different phases of a CFS period)."""
    import random

    import torch

    rng = random.Random(0)
    curves: dict[int, list[float]] = {}
    with torch.inference_mode():
        for _ in range(repeats):
            if sync:
                sync()
            time.sleep(gap_s * (1.0 + 0.5 * rng.random()))
            _, ticks = sm.run_full(x, timed=True)
            total = 0.0
            for idx, ms in ticks:
                total += float(ms)
                curves.setdefault(int(idx), []).append(total)
    return {str(k): statistics.median(v) for k, v in sorted(curves.items())}


def handoff_points(sm: Any, prof: dict, quota: dict) -> list[int]:
    """Valid cuts whose prefixes take about 0.5, 1, 1.5, 2, 3 and 5 times the quota's
    budget in CPU time (from the layers' shares of ``full_cpu_ms``), and the last cut."""
    cum = prefix_cpu_of(prof, sm.n)
    if cum is None:
        return [sm.n]
    valid = [k for k in sm.valid_splits() if k > 0]
    points = {sm.n}
    for f in (0.5, 1.0, 1.5, 2.0, 3.0, 5.0):
        target = f * float(quota["quota_ms"])
        if target < cum[-1]:
            points.add(min(valid, key=lambda k: (abs(cum[k] - target), k)))
    return sorted(points)


def handoff(sm: Any, x: Any, points: list[int], repeats: int, gap_s: float) -> list[dict]:
    """The stall a CPU quota adds when a prefix ends and the edge hands its tensors on.

    Under CFS bandwidth control a process may run past the period's budget until the next
    scheduler tick; the kernel collects that debt the next time it accounts the process's
    time (a blocking send or receive, or a read of its CPU clock), by throttling it until a
    later period. The per-layer times of a pass end before that, so a prefix that ran past
    its budget costs more than its cold curve says, and the rest is paid at the hand-off.

    For each cut k in ``points``: after an idle gap (as :func:`cold_prefix`), run layers
    1..k, stamp the wall clock, read the CPU clock (which collects the debt) and stamp the
    wall clock again. Returns ``[{"split", "cpu_ms", "stall_ms", "samples"}]``: the
    prefix's median CPU time and the mean stall (the second stamp less the first). The
    mean, because the stall is all or nothing (none, or until the next period: 0 or
    6-8 ms at 0.25 core and 10 ms, in about equal shares) and its median flips.
    Measured only under a quota: an unlimited process has no debt.
    """
    import random

    import torch

    rng = random.Random(1)

    def one(k: int) -> tuple[float, float]:
        time.sleep(gap_s * (1.0 + 0.5 * rng.random()))
        _, c0 = clocks()
        sm.run_prefix(k, x)
        t1 = time.perf_counter_ns()
        c1 = time.process_time_ns()
        return (c1 - c0) / 1e6, (time.perf_counter_ns() - t1) / 1e6

    out = []
    with torch.inference_mode():
        for k in points:
            sm.run_prefix(k, x)  # the cut's code is made before it is timed
            runs = [one(k) for _ in range(max(1, repeats))]
            stalls = [s for _, s in runs]
            out.append({"split": k, "cpu_ms": statistics.median(c for c, _ in runs),
                        "stall_ms": statistics.fmean(stalls),
                        "samples": [round(v, 3) for v in stalls]})
    return out


def cpu_quota() -> dict | None:
    """This process's CFS bandwidth limit (cgroup v1 or v2), the tightest on its path.

    ``{"quota_ms", "period_ms", "fraction"}`` or None when unlimited/unknown. Containers
    (docker --cpus) and the emulated lab's slow hosts are limited this way; a throttled
    process runs at full speed until the period's quota is spent, then stalls, which
    predictors need to know (partitioners/predicted.py).
    """
    best: dict | None = None
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, path = parts
        if ctrls == "":
            roots = ["/sys/fs/cgroup"]
        elif "cpu" in ctrls.split(","):
            roots = [f"/sys/fs/cgroup/{ctrls}", "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"]
        else:
            continue
        for root in roots:
            if not os.path.isdir(root):
                continue
            rel = path.strip("/")
            while True:
                d = os.path.join(root, rel) if rel else root
                q = _read_cfs(d)
                if q and (best is None or q["fraction"] < best["fraction"]):
                    best = q
                if not rel:
                    break
                rel = os.path.dirname(rel)
            break
    return best


def _read_cfs(d: str) -> dict | None:
    def read(name: str) -> str:
        with open(os.path.join(d, name)) as f:
            return f.read()

    try:
        if os.path.exists(os.path.join(d, "cpu.cfs_quota_us")):
            quota = int(read("cpu.cfs_quota_us"))
            period = int(read("cpu.cfs_period_us"))
        elif os.path.exists(os.path.join(d, "cpu.max")):
            q, per = read("cpu.max").split()
            if q == "max":
                return None
            quota, period = int(q), int(per)
        else:
            return None
    except (OSError, ValueError):
        return None
    if quota <= 0 or period <= 0:
        return None
    return {"quota_ms": quota / 1000, "period_ms": period / 1000, "fraction": quota / period}
