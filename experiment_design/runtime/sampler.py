"""The participant's metrics sampler: memory, CPU, throttling, frequency and energy.

One daemon thread per participant wakes every ``interval_s`` (50 ms by default) and
appends one sample: RSS and its peak since the previous sample, process CPU seconds,
the cgroup's throttled periods and time, the CPUs' mean frequency (once a second:
:data:`FREQ_EVERY_S`), CUDA's peak
allocated bytes since the previous sample (a CUDA model only) and one reading of every
supported energy collector. It never runs on the inference thread: its cost to the
timed path is what its wake-ups take from the CPU, which ``tracr bench overhead``
measures (``sampling_overhead_ratio``). To keep that small it runs at the lowest
priority (nice 19: it does not preempt the inference thread when it wakes), keeps its
files open and reads each with one ``pread`` (about 10 us of CPU a sample here).

Peaks between samples: where the kernel allows it the sampler resets the RSS high-water
mark after each read (``/proc/self/clear_refs``), so a sample's ``hwm_kb`` is the exact
peak over its interval and no spike between two reads is missed (``peak_method``
``"VmHWM reset per sample"``); elsewhere ``hwm_kb`` is the process's peak so far and
a window's peak is the largest RSS sampled in it (``"sampled VmRSS"``).

At set-up and at the end of every task the participant times a short reference
workload (:func:`reference_times`, off the timed path): the same work at the start and
the end of a run, so a reader sees whether the machine itself sped up or slowed down.
On a CPU it is timed by the process's CPU clock: a CPU quota or the lab's pacer stops
a host for whole ticks, and a product of 0.3 ms either met a stop or did not, so the
wall-time median of a host paced at 0.25 core moved from 0.27 to 1.86 ms within one
run (a "machine drift" of 577% that was the pacer's phase, not the machine).
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from experiment_design.energy import DEFAULT_COLLECTORS, EnergyCollector, Probe, create_energy
from experiment_design.protocol import MetricSample, SamplerFacts
from experiment_design.runtime import procstat
from experiment_design.runtime.clocks import clocks

log = logging.getLogger(__name__)

INTERVAL_S = 0.05
#: samples kept between two polls (a minute at 50 ms); older ones are dropped and counted
MAX_PENDING = 1200
#: seconds between two frequency reads: /proc/cpuinfo is costly to generate, and on x86
#: kernels 4.13 to 5.x reading "cpu MHz" or scaling_cur_freq interrupted every CPU (the
#: inference's included) to sample its clock counters
FREQ_EVERY_S = 1.0
#: the reference workload: matrix products of this size, timed this many times
REFERENCE_N = 256
REFERENCE_REPEATS = 31


def energy_collectors(spec: Any, root: Path | None = None) -> dict[str, EnergyCollector]:
    """Collectors named by ``settings.energy``: a list of names, a mapping name -> params,
    ``"none"``, or None for :data:`~experiment_design.energy.DEFAULT_COLLECTORS`."""
    if spec in ("none", False):
        return {}
    if spec is None:
        spec = list(DEFAULT_COLLECTORS)
    if isinstance(spec, str):
        spec = [spec]
    items = spec.items() if isinstance(spec, dict) else ((name, {}) for name in spec)
    return {name: create_energy(name, root, **(params or {})) for name, params in items}


def _lower_priority() -> int | None:
    """Give the calling thread the lowest priority (nice 19) and return it (None where the
    system has no per-thread priority). A waking sampler of normal priority preempts the
    inference thread on its CPU; one of the lowest weight mostly waits for a free moment."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    except (AttributeError, OSError):
        return None


def reference_times(threads: int | None = None) -> tuple[float, float]:
    """``(CPU ms, wall ms)``: the medians of one fixed piece of work (a 256x256 float32
    matrix product on the CPU, on ``threads`` torch threads) by the process's CPU clock
    and by the wall clock. The CPU time is the machine's own speed, comparable across a
    run whatever share of a CPU a quota or the lab's pacer gives this host."""
    import torch

    if threads:  # the calling thread's own setting: a task thread may not have inherited it
        torch.set_num_threads(threads)
    a = torch.ones(REFERENCE_N, REFERENCE_N)
    cpu, wall = [], []
    with torch.no_grad():
        torch.mm(a, a)
        for _ in range(REFERENCE_REPEATS):
            t0, c0 = clocks()
            torch.mm(a, a)
            t1, c1 = clocks()
            wall.append((t1 - t0) / 1e6)
            cpu.append((c1 - c0) / 1e6)
    return statistics.median(cpu), statistics.median(wall)


class Sampler:
    """Samples this process every ``interval_s`` in a thread; :meth:`drain` hands them over.

    ``collectors`` are energy collectors by name; each is probed once at start and only
    the supported ones are read. ``cuda`` names the CUDA device whose peak allocation is
    sampled (None: the model is not on a GPU).
    """

    def __init__(self, interval_s: float = INTERVAL_S,
                 collectors: dict[str, EnergyCollector] | None = None,
                 root: Path | None = None, cuda: Any = None) -> None:
        self.interval_s = float(interval_s)
        self.root = root if root is not None else Path("/")
        self.collectors = dict(collectors or {})
        self.cuda = cuda
        self.probes: dict[str, dict] = {}
        self.live: dict[str, EnergyCollector] = {}
        self.references: list[dict] = []
        self.dropped = 0
        self._pending: deque[MetricSample] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._running = threading.Event()
        self._thread: threading.Thread | None = None
        self._throttle = procstat.throttle_file(self.root)
        self._freq = procstat.frequency_source(self.root)
        self._mem_source = procstat.memory_kb(self.root)[2]
        self._files = procstat.OpenFiles(self.root, self._throttle,
                                         reset=procstat.reset_peak(self.root))
        self._ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        self._last_cpu: tuple[float, float] | None = None
        self._last_jiffies: tuple[int, int] | None = None
        self._last_freq_t = 0.0
        self._changed = True
        #: torch threads of the reference workload (the participant's, read at set-up)
        self.threads: int | None = None
        self.nice: int | None = None

    # ----- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Sampler:
        """Probe the collectors and start the thread."""
        for name, c in self.collectors.items():
            try:
                p = c.probe()
            except Exception as exc:  # a user's collector: its failure is its reason
                p = Probe(False, f"probe failed: {type(exc).__name__}: {exc}")
            self.probes[name] = {**c.info(), **p.to_dict()}
            if p.supported:
                self.live[name] = c
        self._running.set()
        self._thread = threading.Thread(target=self._loop, name="metrics-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (bounded) and release the collectors."""
        self._stop.set()
        self._running.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        for c in self.collectors.values():
            c.close()
        self._files.close()

    def pause(self) -> None:
        """Stop sampling until :meth:`resume` (the thread sleeps without waking)."""
        self._running.clear()

    def resume(self) -> None:
        """Sample again."""
        self._running.set()

    def _loop(self) -> None:
        self.nice = _lower_priority()
        next_t = time.monotonic()
        while not self._stop.is_set():
            if not self._running.is_set():
                self._running.wait()
                next_t = time.monotonic()
                continue
            try:
                self.sample()
            except Exception as exc:  # a sample lost is counted, the thread goes on
                self.dropped += 1
                log.debug("metrics sample failed: %s", exc)
            next_t += self.interval_s
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (a stopped or throttled process): no burst to catch up
                next_t, delay = time.monotonic(), 0.0
            self._stop.wait(delay)

    # ----- one sample ---------------------------------------------------------------------------
    def sample(self) -> MetricSample:
        """Read everything once and queue the sample."""
        t = time.time()
        rss, hwm = self._files.memory_kb()
        if rss is None and self._mem_source == "psutil":  # no /proc: not Linux
            rss, hwm, _ = procstat.memory_kb(self.root)
        cpu = procstat.cpu_seconds()
        share = 0.0  # the machine's busy share (the process's where /proc/stat is absent)
        jiffies = self._files.machine_jiffies()
        if jiffies is not None and self._last_jiffies is not None:
            dt = jiffies[1] - self._last_jiffies[1]
            share = (jiffies[0] - self._last_jiffies[0]) / dt if dt > 0 else 0.0
        elif self._last_cpu is not None and t > self._last_cpu[0]:
            share = (cpu - self._last_cpu[1]) / (t - self._last_cpu[0]) / self._ncpu
        self._last_cpu, self._last_jiffies = (t, cpu), jiffies
        n_thr, thr_us = self._files.throttled()
        row: MetricSample = {"t_unix": t, "rss_kb": rss, "hwm_kb": hwm, "cpu_s": cpu,
                             "machine_busy": round(share, 4), "nr_throttled": n_thr,
                             "throttled_us": thr_us}
        if t - self._last_freq_t >= FREQ_EVERY_S:
            row["freq_mhz"] = self._freq.mhz()
            self._last_freq_t = t
        if self.cuda is not None:
            import torch

            row["cuda_peak_bytes"] = torch.cuda.max_memory_allocated(self.cuda)
            torch.cuda.reset_peak_memory_stats(self.cuda)
        for name, c in self.live.items():
            try:
                key = f"{name}_{'j' if c.kind == 'counter' else 'w'}"  # named by collector
                row[key] = c.read(share)  # type: ignore[literal-required]
            except Exception as exc:  # a read that fails leaves a gap, never a zero
                log.debug("energy %s read failed: %s", name, exc)
        with self._lock:
            self._pending.append(row)
            while len(self._pending) > MAX_PENDING:
                self._pending.popleft()
                self.dropped += 1
        return row

    def drain(self) -> list[MetricSample]:
        """The samples since the last drain, oldest first."""
        with self._lock:
            out = list(self._pending)
            self._pending.clear()
        return out

    # ----- the reference workload and what the results state -------------------------------------
    def reference(self, at: str) -> dict:
        """Time the reference workload now (``at``: "setup", "task-end") and keep it."""
        paused = self._running.is_set()
        self.pause()  # the sampler's own wake-ups must not disturb the reference either
        try:
            ms, wall_ms = reference_times(self.threads)
        finally:
            if paused:
                self.resume()
        ref = {"at": at, "t_unix": time.time(), "ms": ms, "wall_ms": wall_ms,
               "threads": self.threads}
        with self._lock:
            self.references.append(ref)
            self._changed = True
        return ref

    def info(self, force: bool = False) -> SamplerFacts | None:
        """Sources, collectors and references as plain JSON; None when nothing changed since
        the last call (unless ``force``)."""
        with self._lock:
            if not (self._changed or force):
                return None
            self._changed = False
            refs = list(self.references)
        return {
            "interval_ms": self.interval_s * 1e3,
            "frequency_every_s": FREQ_EVERY_S,
            "sources": {"memory": self._mem_source, "cpu": "os.times",
                        "machine_busy": ("/proc/stat" if self._files.stat is not None
                                         else "this process (os.times)"),
                        "frequency": self._freq.name,
                        "throttling": str(self._throttle) if self._throttle else "none",
                        "cuda": "torch.cuda.max_memory_allocated" if self.cuda is not None
                        else None},
            "peak_method": ("VmHWM reset per sample" if self._files.resets
                            else "sampled VmRSS"),
            "cpus": self._ncpu,
            "sampler_nice": self.nice,
            "energy": self.probes,
            "reference": {"work": f"{REFERENCE_N}x{REFERENCE_N} float32 matrix product, "
                                  f"median of {REFERENCE_REPEATS}",
                          "clock": "process CPU time (ms); wall_ms beside it", "runs": refs},
            "dropped": self.dropped,
        }


def start_sampler(settings: dict, device: Any = None) -> Sampler | None:
    """The participant's sampler as its ``settings`` ask (``sampler_ms``: the period, 0 for
    none; ``energy``: the collectors, see :func:`energy_collectors`), started, with its
    first reference timing taken; None when ``sampler_ms`` is 0."""
    ms = settings.get("sampler_ms")
    ms = INTERVAL_S * 1e3 if ms is None else ms
    if not ms:
        return None
    cuda = device if str(device).startswith("cuda") else None
    import torch

    s = Sampler(float(ms) / 1e3, energy_collectors(settings.get("energy")), cuda=cuda).start()
    s.threads = torch.get_num_threads()
    s.reference("setup")
    return s
