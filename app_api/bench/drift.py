"""How far this machine's speed for the same work moves over minutes, with nothing else running.

A validation run compares its best split's median with the next run's, minutes later. If
the machine itself does the same work faster or slower from one minute to the next, that
movement is in the comparison, whatever tracr does. This benchmark measures it: one child
process per ``--cpu`` (default: every CPU this process may use), each pinned to its CPU,
runs three fixed pieces of work (after three seconds of warm-up) once a round, one round every ``--interval-s``, for
``--seconds``:

- ``gemm``: a 384x384 float32 matrix product (compute-bound; fits the L2 cache),
- ``copy``: a 64 MiB tensor copied into another (memory-bound; larger than the L3 cache
  of most machines),
- ``model``: the MobileNetV2 prefix of ``tracr bench quota`` (``--layers`` feature blocks,
  one thread, the participants' steady allocator).

Each round takes the median CPU time (``thread_time``) of a few repetitions of each. Per
CPU and kind: the median of each ``--window-s`` window, ``drift_pct`` (the largest window
median over the smallest, minus one, in %) and the whole run's median. Across CPUs, per
kind, ``correlation``: Pearson's r between the CPUs' window medians; near 1, the CPUs
slow down and speed up together (the host under a virtual machine, a shared memory
system), near 0, each CPU's own neighbours. A compute-bound ``gemm`` that holds still
while ``copy`` and ``model`` move says the memory system is what moves.

Read ``drift_pct`` of ``model`` against a target for how much a median may move between
runs: where the machine's own drift is larger, the target is not reachable on it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading

from app_api.lab import cgroup

_CHILD = r"""
import json, sys, time
import torch, torchvision
from experiment_design.runtime.allocator import configure
configure("steady")
torch.set_num_threads(1)
torch.manual_seed(0)
layers, seconds, interval = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
net = torch.nn.Sequential(*list(torchvision.models.mobilenet_v2().features)[:layers]).eval()
x = torch.randn(1, 3, 224, 224)
a = torch.randn(384, 384)
src = torch.ones(16 << 20)  # 64 MiB of float32
dst = torch.empty_like(src)
print("ready", flush=True)  # set up: imports and the model, outside the placement
sys.stdin.readline()  # the parent has pinned this process

def cpu_ms(f, n):
    out = []
    for _ in range(n):
        t0 = time.thread_time_ns()
        f()
        out.append((time.thread_time_ns() - t0) / 1e6)
    out.sort()
    return out[len(out) // 2]

rows = []
with torch.inference_mode():
    warm = time.monotonic()
    while time.monotonic() - warm < 3.0:  # first passes run slow (allocation, caches)
        net(x); a @ a; dst.copy_(src)
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        t = time.monotonic() - start
        rows.append([t, cpu_ms(lambda: a @ a, 11), cpu_ms(lambda: dst.copy_(src), 3),
                     cpu_ms(lambda: net(x), 3)])
        time.sleep(max(0.0, interval - (time.monotonic() - start - t)))
print(json.dumps(rows))
"""

KINDS = ("gemm", "copy", "model")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=300.0,
                        help="how long to measure (default 300)")
    parser.add_argument("--window-s", type=float, default=30.0,
                        help="the window whose medians are compared (default 30)")
    parser.add_argument("--interval-s", type=float, default=1.0,
                        help="one round of the three pieces of work every this many seconds")
    parser.add_argument("--cpu", type=int, action="append",
                        help="a CPU to measure on (repeatable; default: every CPU allowed)")
    parser.add_argument("--layers", type=int, default=11,
                        help="MobileNetV2 feature blocks in the model piece (default 11)")


def windows(rows: list[list[float]], window_s: float) -> dict[str, list[float]]:
    """Per kind, the median of each full or partial window of ``window_s`` seconds."""
    out: dict[str, list[float]] = {k: [] for k in KINDS}
    if not rows:
        return out
    last = int(rows[-1][0] // window_s)
    for w in range(last + 1):
        inside = [r for r in rows if w * window_s <= r[0] < (w + 1) * window_s]
        if inside:
            for i, kind in enumerate(KINDS, start=1):
                out[kind].append(statistics.median(r[i] for r in inside))
    return out


def drift_pct(medians: list[float]) -> float | None:
    """The largest window median over the smallest, minus one, in % (None for one window)."""
    if len(medians) < 2 or min(medians) <= 0:
        return None
    return 100 * (max(medians) / min(medians) - 1)


def correlation(a: list[float], b: list[float]) -> float | None:
    """Pearson's r of two series of equal length (None when too short or constant)."""
    n = min(len(a), len(b))
    if n < 3:
        return None
    a, b = a[:n], b[:n]
    try:
        return statistics.correlation(a, b)
    except statistics.StatisticsError:
        return None


def run(args: argparse.Namespace) -> dict:
    cpus = sorted(set(args.cpu)) if args.cpu else sorted(os.sched_getaffinity(0))
    raw: dict[int, object] = {}

    def measure(cpu: int) -> None:
        try:
            out = cgroup.run_pinned(_CHILD, [str(args.layers), str(args.seconds),
                                             str(args.interval_s)], cpu,
                                    timeout=args.seconds + 300, what=f"worker on CPU {cpu}")
            raw[cpu] = json.loads(out.strip().splitlines()[-1])
        except Exception as exc:  # noqa: BLE001 - reported after every worker has ended
            raw[cpu] = exc

    threads = [threading.Thread(target=measure, args=(c,), daemon=True) for c in cpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for cpu in cpus:
        if isinstance(raw[cpu], Exception):
            raise raw[cpu]

    result: dict = {"seconds": args.seconds, "window_s": args.window_s,
                    "model": f"mobilenet_v2 features[:{args.layers}]", "cpus": cpus}
    per_cpu = {cpu: windows(raw[cpu], args.window_s) for cpu in cpus}
    for cpu in cpus:
        rows = raw[cpu]
        result[f"cpu {cpu}"] = {
            kind: {"median_ms": statistics.median(r[i] for r in rows),
                   "window_medians_ms": [round(m, 4) for m in per_cpu[cpu][kind]],
                   "drift_pct": drift_pct(per_cpu[cpu][kind])}
            for i, kind in enumerate(KINDS, start=1)}
        result[f"cpu {cpu}"]["rounds"] = len(rows)
    if len(cpus) >= 2:
        first, second = cpus[0], cpus[1]
        result["correlation"] = {kind: correlation(per_cpu[first][kind], per_cpu[second][kind])
                                 for kind in KINDS}
        result["correlation"]["cpus"] = f"{first} and {second}"
    return result
