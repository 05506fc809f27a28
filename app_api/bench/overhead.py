"""`tracr bench overhead`: what per-layer timing and suffix-only execution cost.

Two ratios, each measured interleaved (A, B, A, B, ... with the order flipped
every round so drift hits both sides), batch 1, CPU, one thread, medians after
a separate warm-up:

- ``timing_overhead_ratio``: a full forward through the split engine with
  per-layer timing on, over plain ``model(x)``; per model.
  ``aa_ratio`` is plain over plain, run in the same rotation: the noise floor;
  ``instrumentation_bound_ratio`` is what the clock reads alone can add.
- ``suffix_ratio``: ``SplitModel.run_suffix(k)`` for a cut inside resnet18's
  layer2 where a skip connection crosses, over the same sub-graph built
  independently with ``torch.fx.passes.split_module`` (no tracr code).

- ``sampling_overhead_ratio``: AlexNet's per-layer timing with a participant's metrics
  sampler running (every 50 ms: memory, CPU, throttling, frequency, every energy
  collector; :mod:`experiment_design.runtime.sampler`) over the same with it paused, in
  blocks of passes rotated every round so the sampler runs at its steady pace: the median
  over rounds of the on block's median pass (the sum of its layers' times) over the off
  block's; ``sampling_aa_ratio`` is off over off in the same rounds (the noise floor),
  ``sample_cpu_us`` what one sample costs, read directly.

With ``--device cuda`` the models run on the GPU and every timed call ends with one
synchronize, as a plain pass does (``model(x)`` then ``torch.cuda.synchronize()``): the
timed pass records a CUDA event per layer and waits once, for the last
(:mod:`experiment_design.split.clock`). ``sync_per_layer_ratio`` times the same pass
with a synchronize and a host clock read at every layer instead, and ``sync_us`` is what
one synchronize of an idle device costs: the price the events avoid at every layer.

The split engine loads torch, so it is imported inside the functions that use it, for
start-up time: ``tracr --help`` imports this module to list the benchmark's arguments.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from experiment_design.errors import TracrError
from experiment_design.models import create_model, example_input
from experiment_design.runtime.sampler import Sampler, energy_collectors

MODELS = ("alexnet", "resnet18")
TARGETS = {"timing_overhead_ratio": 1.05, "suffix_ratio": 1.05, "sampling_overhead_ratio": 1.03}
#: passes per block in the sampling case: long enough for the sampler to reach its pace
SAMPLING_BLOCK = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``tracr bench overhead``."""
    parser.add_argument("--repeats", type=int, default=30, help="measured rounds per pair")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured rounds first")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where the models run (cuda: per-layer CUDA events)")


def _interleaved(
    fns: list[Callable[[], object]], repeats: int, warmup: int, rounds: list | None = None
) -> list[float]:
    """Median ms of each callable, run round-robin with the order rotated every round.

    ``rounds``, if given, receives each round's list of ms (for paired ratios).
    """
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for r in range(repeats):
        for j in range(len(fns)):
            i = (j + r) % len(fns)
            t0 = time.perf_counter_ns()
            fns[i]()
            times[i].append((time.perf_counter_ns() - t0) / 1e6)
        if rounds is not None:
            rounds.append([t[-1] for t in times])
    return [statistics.median(t) for t in times]


def _clock_read_ns(reads: int = 20000) -> float:
    """Median cost of one ``perf_counter_ns`` read (ns), from 20 batches."""
    costs = []
    for _ in range(20):
        t0 = time.perf_counter_ns()
        for _ in range(reads // 20):
            time.perf_counter_ns()
        costs.append((time.perf_counter_ns() - t0) / (reads // 20))
    return statistics.median(costs)


def _sync_us(torch, repeats: int = 200) -> float:
    """Median cost of one ``torch.cuda.synchronize()`` with nothing queued (microseconds)."""
    torch.cuda.synchronize()
    costs = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        torch.cuda.synchronize()
        costs.append((time.perf_counter_ns() - t0) / 1e3)
    return statistics.median(costs)


def _suffix_case(repeats: int, warmup: int) -> dict:
    import torch
    from torch import fx
    from torch.fx.passes.split_module import split_module

    from experiment_design.split import SplitModel

    model = create_model("resnet18")
    x = example_input("resnet18")
    sm = SplitModel.build(model, x)
    cands = [
        p.index
        for p in sm.points
        if p.valid and p.layer.startswith("layer2") and len(p.crossing) > 1
    ]
    k = cands[len(cands) // 2]
    gm = fx.symbolic_trace(model)
    compute = [n for n in gm.graph.nodes if n.op in ("call_module", "call_function", "call_method")]
    order = {n: i + 1 for i, n in enumerate(compute)}
    parts = split_module(gm, model, lambda n: 0 if order[n] <= k else 1)
    alone = parts.submod_1
    names = [n.name for n in alone.graph.nodes if n.op == "placeholder"]
    with torch.no_grad():
        crossing, _ = sm.run_prefix(k, x)
        args = [crossing[nm] for nm in names]

        def tracr_suffix():
            return sm.run_suffix(k, crossing)

        def plain_suffix():
            return alone(*args)

        t_tracr, t_alone = _interleaved([tracr_suffix, plain_suffix], repeats, warmup)
    return {
        "suffix_ratio": t_tracr / t_alone,
        "suffix_split": k,
        "suffix_layer": sm.points[k].layer,
        "suffix_crossing": list(sm.points[k].crossing),
        "suffix_ms": t_tracr,
        "suffix_alone_ms": t_alone,
    }


def _sampling_case(repeats: int, warmup: int, device: str, done: Callable) -> dict:
    """Per-layer timing of AlexNet with the participant's sampler running against paused,
    in blocks rotated each round (off, on, off again: the A/A noise floor)."""
    import torch

    from experiment_design.split import SplitModel

    sm = SplitModel.build(create_model("alexnet"), example_input("alexnet"))
    x = sm.example
    if device == "cuda":
        sm.to("cuda")
        x = x.to("cuda")
    sampler = Sampler(collectors=energy_collectors(None),
                      cuda=x.device if device == "cuda" else None).start()
    states = ("off", "on", "off2")
    passes: dict[str, list[float]] = {s: [] for s in states}
    rounds: list[dict[str, float]] = []
    try:
        with torch.no_grad():
            for _ in range(warmup):
                done(sm.run_full(x, timed=True))
            for r in range(repeats):
                block: dict[str, float] = {}
                for j in range(len(states)):
                    state = states[(j + r) % len(states)]
                    (sampler.resume if state == "on" else sampler.pause)()
                    times_of_block = []
                    for _ in range(SAMPLING_BLOCK):
                        _, times = done(sm.run_full(x, timed=True))
                        times_of_block.append(sum(ms for _, ms in times))
                    passes[state].extend(times_of_block)
                    block[state] = statistics.median(times_of_block)
                rounds.append(block)
        sampler.pause()
        samples = len(sampler.drain())
        # what one sample costs the process, read directly (CPU time, this thread)
        t0 = time.thread_time_ns()
        for _ in range(100):
            sampler.sample()
        sample_cpu_us = (time.thread_time_ns() - t0) / 100 / 1e3
        sampler.drain()
    finally:
        sampler.stop()
    med = {s: statistics.median(v) for s, v in passes.items()}
    return {
        # same round, adjacent blocks: a shared machine's slow drift cancels
        "sampling_overhead_ratio": statistics.median(b["on"] / b["off"] for b in rounds),
        "sampling_aa_ratio": statistics.median(b["off2"] / b["off"] for b in rounds),
        "sampling_unpaired_ratio": med["on"] / med["off"],
        "sampling_mean_ratio": statistics.fmean(passes["on"]) / statistics.fmean(passes["off"]),
        "sampling_ms": {"off": med["off"], "on": med["on"]},
        "sampling_passes": len(passes["on"]),
        "sampling_samples": samples,
        "sampling_interval_ms": sampler.interval_s * 1e3,
        "sample_cpu_us": sample_cpu_us,
        "sampling_cpu_share": sample_cpu_us / (sampler.interval_s * 1e6),
        "sampling_collectors": sorted(sampler.live),
    }


def run(args: argparse.Namespace) -> dict:
    """Measure both ratios; returns the benchmark dictionary."""
    import torch

    from experiment_design.split import SplitModel

    repeats = getattr(args, "repeats", 30)
    warmup = getattr(args, "warmup", 3)
    device = getattr(args, "device", "cpu")
    if repeats < 1 or warmup < 0:
        raise TracrError("--repeats must be >= 1 and --warmup >= 0")
    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise TracrError("--device cuda: CUDA is not available here",
                         hint="run it on a machine with an NVIDIA GPU, or use --device cpu")
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)

    def done(result):  # a GPU call returns once queued: wait, as a measured pass does
        if cuda:
            torch.cuda.synchronize()
        return result

    try:
        clock_ns = _clock_read_ns()
        sync_us = _sync_us(torch) if cuda else None
        models = {}
        for name in MODELS:
            model = create_model(name)
            x = example_input(name)
            sm = SplitModel.build(model, x)
            if cuda:
                sm.to("cuda")
                model, x = sm.model, x.to("cuda")
            with torch.no_grad():
                # the second plain run is an A/A control: the noise floor of this machine
                rounds: list[list[float]] = []
                fns = [
                    lambda m=model, x=x: done(m(x)),
                    lambda s=sm, x=x: done(s.run_full(x, timed=True)),
                    lambda m=model, x=x: done(m(x)),
                ]
                if cuda:
                    fns.append(lambda s=sm, x=x: done(s.run_full(x, timed="sync")))
                plain_ms, timed_ms, plain2_ms, *synced = _interleaved(
                    fns,
                    repeats,
                    warmup,
                    rounds,
                )
            models[name] = {
                "timing_overhead_ratio": timed_ms / plain_ms,
                "plain_ms": plain_ms,
                "timed_ms": timed_ms,
                "aa_ratio": plain2_ms / plain_ms,
                # same round, adjacent in time: slow drift of a shared machine cancels
                "paired_ratio": statistics.median(r[1] / r[0] for r in rounds),
                # what the clock reads themselves can cost: reads x measured cost of one read
                "clock_read_ns": clock_ns,
                "instrumentation_bound_ratio": 1 + (sm.n + 1) * clock_ns / 1e6 / plain_ms,
                "layers": sm.n,
                "mode": sm.mode,
            }
            if cuda:
                models[name].update(
                    sync_per_layer_ms=synced[0], sync_per_layer_ratio=synced[0] / plain_ms,
                    timing="CUDA events on the current stream, one synchronize per pass")
            else:
                models[name]["timing"] = "perf_counter_ns between layers"
        result: dict = {"models": models}
        if cuda:
            result["sync_us"] = sync_us
        else:  # the split_module comparison is of code on the CPU
            result.update(_suffix_case(repeats, warmup))
        result.update(_sampling_case(repeats, warmup, device, done))
    finally:
        torch.set_num_threads(threads_before)
    result["timing_overhead_ratio"] = {n: m["timing_overhead_ratio"] for n, m in models.items()}
    result["targets"] = dict(TARGETS)
    result["met"] = {
        "timing_overhead_ratio": all(
            r <= TARGETS["timing_overhead_ratio"] for r in result["timing_overhead_ratio"].values()
        ),
    }
    if "suffix_ratio" in result:
        result["met"]["suffix_ratio"] = result["suffix_ratio"] <= TARGETS["suffix_ratio"]
    result["met"]["sampling_overhead_ratio"] = (
        result["sampling_overhead_ratio"] <= TARGETS["sampling_overhead_ratio"])
    result["threads"] = 1
    result["repeats"] = repeats
    result["device"] = torch.cuda.get_device_name(0) if cuda else "cpu"
    return result
