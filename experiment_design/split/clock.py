"""Clock reads for per-layer timing.

On the CPU a tick is an integer of nanoseconds. On a GPU a tick is a CUDA event recorded
on the current stream: recording does not wait, so the layers queue as they would
untimed, and a pass waits once, for its last event (:func:`ticks_to_ms`), where reading a
host clock per layer would have to synchronize per layer (the launch alone is timed
otherwise) and stall the queue at every layer. An event's elapsed time to the next one is
the GPU time between them."""

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
    process's CPU time (CPU devices only: a GPU's work is not this process's CPU time);
    ``timed="sync"`` on a GPU synchronizes and reads the host clock at every layer (the
    old method, kept for ``tracr bench overhead --device cuda`` to compare)."""
    if not timed:
        return None
    if cuda:
        return cuda_sync_clock if timed == "sync" else cuda_event_clock
    return process_cpu_clock if timed == "cpu" else cpu_clock


def cuda_event_clock() -> torch.cuda.Event:
    """A timing event recorded on the current CUDA stream; nothing waits for it here."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def cuda_sync_clock() -> int:
    """Wait for queued GPU work, then read the host clock (otherwise we time the launch
    only): a synchronize per read."""
    torch.cuda.synchronize()
    return perf_counter_ns()


def elapsed_ms(start, end) -> float:
    """Milliseconds between two ticks of one clock (nanosecond integers or CUDA events;
    events must have completed: see :func:`settle`)."""
    if isinstance(start, int):
        return (end - start) / 1e6
    return float(start.elapsed_time(end))


def settle(last_tick) -> None:
    """Wait until the work before ``last_tick`` is done when it is a CUDA event: the one
    wait of a timed pass, after which every earlier event of its stream has completed."""
    if last_tick is not None and not isinstance(last_tick, int):
        last_tick.synchronize()


def ticks_to_ms(first_index: int, ticks) -> list[tuple[int, float]]:
    """[(layer_index, ms), ...] from clock readings taken before the first layer and after
    each (a GPU pass waits here once, for its last event)."""
    if ticks:
        settle(ticks[-1])
    return [(first_index + i, elapsed_ms(ticks[i], ticks[i + 1])) for i in range(len(ticks) - 1)]


def spans_to_ms(spans) -> list[tuple[int, float]]:
    """[(layer_index, ms), ...] from ``(layer_index, start tick, end tick)`` spans (the
    hooks engine's), waiting once for the latest end on a GPU."""
    if spans:
        settle(spans[-1][2])  # appended as the layers ran: the last end was recorded last
    return [(i, elapsed_ms(a, b)) for i, a, b in spans]
