"""What an interruption costs a computing thread on this machine, and what pacing costs it.

A lab host slowed by time-slicing (the pacer of ``--cpu-mode duty``, or a CFS quota) is
interrupted again and again while it computes: the pacer stops and continues it and
wakes a thread on its CPU at every tick. On bare metal an interruption costs a thread a
few microseconds of cache and TLB refill; on a virtual machine it can cost far more, and
that cost is CPU time of the host's own work: the same layers take more CPU time paced
than unpaced, which a slower device would not show.

This benchmark measures it. The same MobileNetV2 prefix as ``tracr bench quota`` runs
back to back in a process pinned to one CPU (at a real-time priority, so the machine's
other work does not land on that CPU; root needed, else at normal priority and said so):
``alone``; then beside an intruder pinned to the same CPU at a higher real-time priority
that wakes every ``--every-us`` microseconds and does nothing (``woken every N us``);
then paced by the lab's pacer at ``--fraction`` of a core (``paced F``), in a cgroup of its
own (at normal priority, as a lab host runs: such a cgroup has no real-time budget). Per case the median CPU and wall time of a pass and ``cpu_inflation`` (its CPU time
over ``alone``'s); for the intruder cases ``cost_per_wakeup_us``, the CPU time one
wake-up added to the pass (the added CPU time over the wake-ups in a pass). The cases
run one after the other in one run: compare a figure with the other cases of the same
run only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app_api.lab import cgroup, pacer
from app_api.lab.cgroup import run_pinned
from app_api.lab.system import stop_pid
from experiment_design.errors import TracrError

_WORKER_PRIO = 5  # above every normal task, below the intruder and the pacer (50)
_INTRUDER_PRIO = 20

_WORKER = r"""
import json, sys, time
import torch, torchvision
from experiment_design.runtime.allocator import configure
configure("steady")
torch.set_num_threads(1)
torch.manual_seed(0)
layers, repeats = int(sys.argv[1]), int(sys.argv[2])
net = torch.nn.Sequential(*list(torchvision.models.mobilenet_v2().features)[:layers]).eval()
x = torch.randn(1, 3, 224, 224)
print("ready", flush=True)  # set up: imports and the model, outside the placement
sys.stdin.readline()  # the parent has placed this process (priority, CPU, cgroup)
out = []
with torch.inference_mode():
    for _ in range(5):
        net(x)
    for _ in range(repeats):
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        net(x)
        out.append(((time.perf_counter_ns() - w0) / 1e6, (time.thread_time_ns() - c0) / 1e6))
print(json.dumps(out), flush=True)
"""

_INTRUDER = r"""
import os, sys, time
every = float(sys.argv[1]) / 1e6
nxt = time.monotonic()
while True:
    nxt += every
    delay = nxt - time.monotonic()
    if delay > 0:
        time.sleep(delay)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `tracr bench preempt`."""
    parser.add_argument("--every-us", type=int, action="append",
                        help="an intruder's wake-up interval in us (repeatable; default "
                             "1000 and 250)")
    parser.add_argument("--fraction", type=float, default=0.25,
                        help="the paced case's share of a core (default 0.25; 0 skips it)")
    parser.add_argument("--tick-ms", type=float, default=None,
                        help="the pacer's tick in ms (default: the lab's, 1)")
    parser.add_argument("--layers", type=int, default=11,
                        help="MobileNetV2 feature blocks per pass (default 11: ~10 ms of CPU)")
    parser.add_argument("--repeats", type=int, default=60, help="passes per case (default 60)")
    parser.add_argument("--cpu", type=int, default=None,
                        help="the CPU to pin to (default: the last one this process may use)")


def _realtime(pid: int, prio: int) -> bool:
    try:
        os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(prio))
        return True
    except (OSError, AttributeError):
        return False


def _worker(layers: int, repeats: int, cpu: int, cgroup_dir: Path | None) -> dict:
    """One case's passes: median wall and CPU time of a pass (ms). In a cgroup of its own
    (no real-time budget there) at normal priority, as a lab host; else real-time."""
    placed: list[bool] = []

    def place(pid: int) -> None:
        placed.append(cgroup_dir is None and _realtime(pid, _WORKER_PRIO))

    out = run_pinned(_WORKER, [str(layers), str(repeats)], cpu, cgroup_dir,
                     what="benchmark's worker", place=place)
    rows = json.loads(out.strip().splitlines()[-1])
    wall = statistics.median(r[0] for r in rows)
    cpu_ms = statistics.median(r[1] for r in rows)
    return {"cpu_ms": round(cpu_ms, 3), "wall_ms": round(wall, 3), "realtime": placed[0]}


def _intruder(every_us: int, cpu: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _INTRUDER, str(every_us)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    os.sched_setaffinity(proc.pid, {cpu})
    _realtime(proc.pid, _INTRUDER_PRIO)
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _paced(args: argparse.Namespace, cpu: int) -> dict:
    """The worker paced by the lab's pacer at ``args.fraction`` in a cgroup of its own."""
    tick_us = pacer.DEFAULT_PERIOD_US if args.tick_ms is None else int(args.tick_ms * 1000)
    path = cgroup.create(f"tracr-bench-preempt-{os.getpid()}", 1.0)
    with tempfile.TemporaryDirectory(prefix="tracr-bench-preempt-") as tmp:
        alive, log = Path(tmp) / "alive", Path(tmp) / "pacer.log"
        alive.write_text("")
        pid = pacer.start([(str(path), args.fraction)], tick_us, alive, log)
        try:
            deadline = time.monotonic() + 10.0
            while pacer.READY not in (log.read_text(errors="replace") if log.exists() else ""):
                if time.monotonic() > deadline:
                    raise TracrError(f"the pacer did not start within 10 s; see {log}")
                time.sleep(0.02)
            case = _worker(args.layers, args.repeats, cpu, path)
        finally:
            stop_pid(pid, timeout=3.0)
            cgroup.remove(path)
    case["tick_ms"] = tick_us / 1000
    case["wall_x_fraction_over_cpu"] = round(case["wall_ms"] * args.fraction / case["cpu_ms"], 3)
    return case


def run(args: argparse.Namespace) -> dict:
    """The cases, one after the other; figures relative to ``alone`` of the same run."""
    cpu = args.cpu if args.cpu is not None else max(os.sched_getaffinity(0))
    result: dict = {"model": f"mobilenet_v2 features[:{args.layers}]",
                    "repeats": args.repeats, "cpu": cpu}
    alone = _worker(args.layers, args.repeats, cpu, None)
    result["alone"] = alone
    if not alone["realtime"]:
        result["note"] = ("not root: the worker ran at normal priority, so the machine's "
                          "other work can land on its CPU")
    for every in args.every_us or [1000, 250]:
        intruder = _intruder(every, cpu)
        try:
            case = _worker(args.layers, args.repeats, cpu, None)
        finally:
            _stop(intruder)
        added = case["cpu_ms"] - alone["cpu_ms"]
        wakeups = case["wall_ms"] * 1000 / every
        case["cpu_inflation"] = round(case["cpu_ms"] / alone["cpu_ms"], 4)
        case["cost_per_wakeup_us"] = round(1000 * added / wakeups, 2)
        result[f"woken every {every} us"] = case
    if args.fraction and os.geteuid() == 0 and cgroup.cgroup_version() is not None:
        case = _paced(args, cpu)
        case["cpu_inflation"] = round(case["cpu_ms"] / alone["cpu_ms"], 4)
        result[f"paced {args.fraction:g}"] = case
    elif args.fraction:
        result["paced"] = "skipped: pacing needs root and the cgroup cpu controller"
    return result
