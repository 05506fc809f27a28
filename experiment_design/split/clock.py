"""Clock reads for per-layer timing; the CUDA variant synchronizes first."""

from __future__ import annotations

import time

import torch

perf_counter_ns = time.perf_counter_ns


def cpu_clock() -> int:
    """Nanoseconds from the monotonic performance counter."""
    return perf_counter_ns()


def process_cpu_clock() -> int:
    """Nanoseconds of CPU time used by this process (all its threads). A layer timed with
    it costs the same whether the process was throttled, stopped or preempted during it:
    the shape of a model's work on a host whose wall time a quota or a pacer stretches."""
    return time.process_time_ns()


def layer_clock(timed: bool | str, cuda: bool):
    """The clock for per-layer timing: None if not ``timed``; ``timed="cpu"`` asks for the
    process's CPU time (CPU devices only: a GPU's work is not this process's CPU time)."""
    if not timed:
        return None
    if cuda:
        return cuda_clock
    return process_cpu_clock if timed == "cpu" else cpu_clock


def cuda_clock() -> int:
    """Wait for queued GPU work, then read the clock (otherwise we time the launch only)."""
    torch.cuda.synchronize()
    return perf_counter_ns()


def ticks_to_ms(first_index: int, ticks) -> list[tuple[int, float]]:
    """[(layer_index, ms), ...] from clock readings taken before the first layer and after each."""
    return [(first_index + i, (ticks[i + 1] - ticks[i]) / 1e6) for i in range(len(ticks) - 1)]
