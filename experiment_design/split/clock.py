"""Clock reads for per-layer timing; the CUDA variant synchronizes first."""

from __future__ import annotations

import time

import torch

perf_counter_ns = time.perf_counter_ns


def cpu_clock() -> int:
    """Nanoseconds from the monotonic performance counter."""
    return perf_counter_ns()


def cuda_clock() -> int:
    """Wait for queued GPU work, then read the clock (otherwise we time the launch only)."""
    torch.cuda.synchronize()
    return perf_counter_ns()


def ticks_to_ms(first_index: int, ticks) -> list[tuple[int, float]]:
    """[(layer_index, ms), ...] from clock readings taken before the first layer and after each."""
    return [(first_index + i, (ticks[i + 1] - ticks[i]) / 1e6) for i in range(len(ticks) - 1)]
