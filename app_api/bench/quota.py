"""How steady one CPU is for a fixed piece of model work, with and without a CPU quota.

The same prefix of MobileNetV2 (``--layers`` of its feature blocks, one thread, the
participants' steady allocator) runs ``--repeats`` times in a child process pinned to
one CPU, each pass after a random idle gap of up to two CFS periods (an edge idles while
the link and the cloud work, so its passes start at every phase of a period; ``--gap-ms``
sets the longest gap). First unlimited and back to back (no gap), then unlimited with the
gaps, then in a cgroup of its own at each ``--fraction`` of a core (``--period-ms``),
created for the run and removed after it (root and the cgroup ``cpu`` controller needed;
without them only the unlimited cases run).

Per case: the median wall and CPU time of a pass, their spread (the interquartile range
and the 10th-90th percentile range, as shares of the median) and the split-half
difference: the passes are dealt alternately into two halves and the two medians
compared, which is what a sweep's split-half noise is made of. ``idle_inflation`` is the
gapped unlimited case's median CPU time over the back-to-back one's: what an idle spell
costs the next pass (on a virtual machine whose idle CPU halts, +35% was measured after
20 ms idle while the host was busy, none an hour later: the host runs something else on
the core and the caches go cold).
``cpu_inflation`` is a quota'd case's median CPU time over the gapped unlimited one's:
what stalling at the quota adds on top. The cases run one after the other, so a figure
compares with the other cases of the same run only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from app_api.lab import cgroup

_CHILD = r"""
import json, random, sys, time
import torch, torchvision
from experiment_design.runtime.allocator import configure
configure("steady")
torch.set_num_threads(1)
torch.manual_seed(0)
layers, repeats, gap_ms = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
net = torch.nn.Sequential(*list(torchvision.models.mobilenet_v2().features)[:layers]).eval()
x = torch.randn(1, 3, 224, 224)
print("ready", flush=True)  # set up: imports and the model, outside the placement
sys.stdin.readline()  # the parent has placed this process in its cgroup
rng = random.Random(1)
out = []
with torch.inference_mode():
    for _ in range(3):
        net(x)
    for _ in range(repeats):
        time.sleep(rng.uniform(0.0, gap_ms) / 1000)
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        net(x)
        out.append(((time.perf_counter_ns() - w0) / 1e6, (time.thread_time_ns() - c0) / 1e6))
print(json.dumps(out))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fraction", type=float, action="append",
                        help="a CPU quota to measure, in cores (repeatable; default 0.25)")
    parser.add_argument("--period-ms", type=float, default=None,
                        help="the CFS period of the quota'd cases (default: the lab's, 10 ms)")
    parser.add_argument("--layers", type=int, default=11,
                        help="MobileNetV2 feature blocks per pass (default 11: ~10 ms of CPU)")
    parser.add_argument("--repeats", type=int, default=60, help="passes per case (default 60)")
    parser.add_argument("--gap-ms", type=float, default=None,
                        help="the longest idle gap before a pass (default: two CFS periods)")
    parser.add_argument("--cpu", type=int, default=None,
                        help="the CPU to pin to (default: the last one this process may use)")


def _spread(xs: list[float]) -> dict:
    q = statistics.quantiles(xs, n=10)
    q4 = statistics.quantiles(xs, n=4)
    med = statistics.median(xs)
    a, b = statistics.median(xs[0::2]), statistics.median(xs[1::2])
    return {"median_ms": med, "iqr_pct": 100 * (q4[2] - q4[0]) / med,
            "p10_p90_pct": 100 * (q[8] - q[0]) / med,
            "split_half_pct": 100 * abs(a - b) / min(a, b)}


def _case(layers: int, repeats: int, gap_ms: float, cpu: int, cgroup_dir: Path | None) -> dict:
    out = cgroup.run_pinned(_CHILD, [str(layers), str(repeats), str(gap_ms)], cpu, cgroup_dir,
                            what="benchmark's worker")
    rows = json.loads(out.strip().splitlines()[-1])
    wall, cpu_ms = [r[0] for r in rows], [r[1] for r in rows]
    return {"wall": _spread(wall), "cpu": _spread(cpu_ms),
            "wall_over_cpu": statistics.median(wall) / statistics.median(cpu_ms)}


def run(args: argparse.Namespace) -> dict:
    fractions = args.fraction or [0.25]
    cpu = args.cpu if args.cpu is not None else max(os.sched_getaffinity(0))
    period = cgroup.period_us(args.period_ms)
    result: dict = {"model": f"mobilenet_v2 features[:{args.layers}]", "repeats": args.repeats,
                    "cpu": cpu, "period_ms": period / 1000}
    gap = 2 * period / 1000 if args.gap_ms is None else float(args.gap_ms)
    result["gap_ms"] = gap
    result["back to back"] = _case(args.layers, args.repeats, 0.0, cpu, None)
    result["unlimited"] = _case(args.layers, args.repeats, gap, cpu, None)
    result["unlimited"]["idle_inflation"] = (result["unlimited"]["cpu"]["median_ms"]
                                             / result["back to back"]["cpu"]["median_ms"])
    can_quota = os.geteuid() == 0 and cgroup.cgroup_version() is not None
    if not can_quota:
        result["quota"] = "skipped: a CPU quota needs root and the cgroup cpu controller"
        return result
    base_cpu = result["unlimited"]["cpu"]["median_ms"]
    for fraction in fractions:
        path = cgroup.create(f"tracr-bench-{os.getpid()}", fraction, period)
        try:
            case = _case(args.layers, args.repeats, gap, cpu, path)
        finally:
            cgroup.remove(path)
        case["cpu_inflation"] = case["cpu"]["median_ms"] / base_cpu
        result[f"quota {fraction:g}"] = case
    return result
