"""CPU pacing of lab hosts (``tracr lab up --cpu-mode duty``).

A CFS quota caps a host's CPU time per period, but a host that idled starts its next
burst with the whole period's budget, and the kernel enforces the budget only at its tick
(4 ms at HZ=250): a lone pass runs at full speed and a busy host at its quota. Measured
here (a busy loop of C ms of CPU after a 5-25 ms idle gap, wall / C x fraction, 1 = a
CPU that slow; `tests/integration/test_lab_pacer.py` repeats it): under 0.6 core at a
10 ms period 0.60 for C up to 2 ms and 0.63 for 7 ms (full speed), 0.81 for 20 ms; at
0.25 core 0.25 up to 2 ms. A device that slow runs every pass slower, whatever it did
before, and that is what the pacer emulates.

Every tick (1 ms by default) the pacer reads the CPU clock of each paced process and
keeps a credit per host (:class:`Credit`): it grows by the host's fraction of the wall
time, shrinks by the CPU time the host used, and is capped at one tick's worth; an idle
gap earns nothing, so an idle host cannot save up a burst, and a burst pays, later in
the burst, for the part it ran at full speed before the pacer's tick saw it. A host whose
credit is spent is stopped (SIGSTOP to each of its threads) until a tick's worth of
credit is back (the pacer wakes for that between ticks), so it gets its fraction of CPU
time at a tick's granularity, busy or not; time a host waits for a CPU, or stopped, is
not charged to it. The kernel adds a running thread's time to its process's clock only at a context
switch or its own tick, so a thread of the pacer on every CPU wakes just before each tick
and its real-time wake-up makes that context switch.

**The tick is a trade-off.** A stop wakes every thread of the process (a group stop;
the cgroup freezer does the same), and that work is CPU time of the host, so a stopped
host waits for a whole tick's worth of credit (``resume_level``) rather than for 0. A
longer tick stops a host less often and costs the pacer less (11% of a core at 1 ms, 6%
at 2 ms, three busy hosts), but lets a burst shorter than a tick run at full speed. Lone
bursts of 2 / 7 / 20 ms at 0.25 core, wall x fraction / CPU (median of 24, two runs):
0.93-0.97 / 0.98-0.99 / 1.00 at a 1 ms tick, 0.65-0.72 / 0.91-0.97 / 0.99 at 2 ms; at
0.6 core 0.97-1.03 / 1.02 / 0.99-1.01 and 0.61-1.24 / 1.01-1.02 / 0.99 (a 2 ms burst at a
2 ms tick is either seen or not: its mean was 0.94-1.05). A busy loop gets 0.60 of a core
under 0.6 (0.25 under 0.25) at each. A 3-host pipeline
(`tracr bench pipeline`) ran 55-61 inferences/s at a 2 ms tick, 45-49 at 1 ms.
**The holds are recorded.** Each stop of a host (from its SIGSTOP to its SIGCONT, on
``perf_counter``, the clock every lab host's timers read) goes to the lab's holds file
(``--holds``; :mod:`app_api.lab.holds`), so a run can tell the time the lab held a host
from time no timer explains (:mod:`app_api.results.budget`: a hold that falls in a
stage's hand-off, between its compute and its send, is ``held_ms``).

The pacer is one process per lab (started by ``lab up``, stopped by ``lab
down``), at a real-time priority so its ticks keep time. It paces every process in a
host's cgroup except sshd (its listener and sessions carry the control channel; paced,
new ssh connections were closed at once). On SIGTERM, SIGINT or SIGHUP, on any error,
and when the lab's state file or a host's cgroup disappears, it continues every process
it paces before it exits; ``lab down`` continues them again after stopping it, so no host
is left stopped.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from app_api.lab.holds import HOLDS_FLUSH_S, HoldLog
from app_api.lab.system import find_helpers, helper_is_ours, start_helper
from experiment_design.runtime import heap

DEFAULT_PERIOD_US = 1_000  # the tick (see the module's docstring)
MIN_PERIOD_US = 200  # a shorter tick is mostly the pacer's own wake-ups
MAX_PERIOD_US = 10_000
_SKIP = ("sshd",)  # process names never paced (see the module's docstring)
_CHECK_S = 1.0  # how often the pacer checks that its lab still exists
_LEAD_S = 30e-6  # the tickers wake this much before the pacer reads the clocks
_RECHECK_S = 0.02  # how long a process found to be sshd is taken to stay sshd
_EPS_S = 5e-6  # a stopped host this close to its resume level is continued
IDLE_SHARE = 0.05  # a running host that used less of the wall time than this lulled,
IDLE_GAP_S = 0.004  # and one that lulled this long was idle (see Credit)
READY = "pacing from pacer"  # the line the pacer logs once it paces (see run())


def step(credit: float, fraction: float, dt: float, used: float, depth: float) -> float:
    """A host's credit after ``dt`` of wall time in which it used ``used`` of CPU time:
    it earns ``fraction`` of the wall time and is capped at ``depth`` (what a stopped host
    waits for, :func:`resume_level`). For a host busy or stopped the whole interval; see
    :class:`Credit` for one that idles."""
    return min(depth, credit + fraction * dt - used)


class Credit:
    """One paced host's credit: :func:`step`, except that an idle gap earns nothing.

    The pacer sees a running host only at its ticks, so a burst runs at full speed until
    the next one. When idle time earned credit (up to a tick's worth), that time was
    spent at once: the debt of a burst's unnoticed start was paid while idle, and every
    lone burst began with a tick's worth; 7 ms of CPU after an idle gap on a 0.6 host at
    a 2 ms tick took 0.84 of the wall time a CPU that slow takes, 2 ms 0.60 (full speed).
    A slower CPU would have spent that idle time still computing. So once a running host
    has used under ``IDLE_SHARE`` of the wall time for at least ``IDLE_GAP_S``, that gap
    earns nothing when its next burst begins: the idle tail of the last busy interval
    before it is taken back, the interval the burst starts in earns on the CPU time it
    used (it ran at full speed since it started), and a debt is paid in that burst. A
    shorter lull keeps what it earned: a host waiting for a CPU uses little too, and time
    a host waits for a CPU is not charged to it (taking every lull for idle, three busy
    0.6 hosts on two CPUs got 0.49, 0.50 and 0.60 of a core, against 0.54 each). A
    stopped host's wait earns, up to ``depth``."""

    def __init__(self, fraction: float, depth: float) -> None:
        self.fraction = fraction
        self.depth = depth
        self.value = 0.0
        self._lull = 0.0  # wall time of the current run of nearly idle intervals
        self._before = 0.0  # the credit as that run began, less what it must give back
        self._tail = 0.0  # what the last busy interval earned beyond the CPU it used

    def update(self, dt: float, used: float, running: bool,
               runnable: Callable[[], bool] | None = None) -> float:
        """The credit after ``dt`` of wall time in which the host used ``used`` of CPU
        time, ``running`` (not stopped) or stopped. ``runnable``: whether a thread of the
        host is running or waiting for a CPU now, asked once a lull reaches
        ``IDLE_GAP_S``: a host that is, was not idle (it waited for a CPU, or its CPU
        clock lagged), and its lull starts over."""
        f = self.fraction
        if not running:
            self.value = step(self.value, f, dt, used, self.depth)
            self._lull = self._tail = 0.0
        elif used < IDLE_SHARE * dt:
            if self._lull == 0.0:
                self._before = self.value - self._tail
            lull = self._lull + dt
            self._before -= used
            self.value = step(self.value, f, dt, used, self.depth)
            if self._lull < IDLE_GAP_S <= lull and runnable is not None and runnable():
                lull = 0.0
            self._lull = lull
        else:
            base, earned = self.value, f * dt
            if self._lull >= IDLE_GAP_S:  # it was idle: the gap earned nothing
                base, earned = self._before, f * used
            self.value = min(self.depth, base + earned - used)
            self._tail = f * max(0.0, dt - used)
            self._lull = 0.0
        return self.value


def resume_level(fraction: float, tick: float) -> float:
    """The credit at which a stopped host is continued: a whole tick's worth (its cap).
    Continued as soon as it was back to 0, a busy host was stopped at every tick, and each
    stop wakes every thread of the process (a group stop), CPU time the host pays for: a
    MobileNetV2 pass on a paced 0.6 host with 16 idle threads beside it took 33% more CPU
    time than without them; from a tick's worth, 1%."""
    return fraction * tick


def wake_at(tick_at: float, stopped: list[tuple[float, float, float, float]]) -> float:
    """When the pacer next wakes: at the next tick (``tick_at``), or sooner where a stopped
    host's credit reaches the level it is continued at; ``stopped`` holds each stopped
    host's (time of its last update, credit then, fraction, that level). A stopped host
    uses no CPU, so its credit grows by its fraction of the wall time."""
    return min([tick_at, *(t + max(0.0, level - c) / f for t, c, f, level in stopped)])


def cpu_clock_id(pid: int) -> int:
    """The clock id of process ``pid``'s CPU time (all its threads), for clock_gettime."""
    return ((~int(pid)) << 3) | 2  # CPUCLOCK_SCHED, process-wide


def _tgkill():
    """libc's tgkill (thread-directed signals to another process), or None."""
    import ctypes
    import ctypes.util

    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).tgkill
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


class _Hosts:
    """The processes of each paced host's cgroup, sshd left out. A process found paced
    stays paced; one found to be sshd is looked at again after ``_RECHECK_S``, since an
    sshd child becomes the session's command when it execs (same PID, new name).

    A stop goes to every thread of a process, not to the process: the kernel hands a
    process-directed SIGSTOP to one thread, often a sleeping one, and the stop waits until
    that thread is scheduled; on a host pinned to one CPU the computing thread kept the
    CPU until the next tick and the next SIGCONT cancelled the stop (a torch pass
    on a worker thread ran at 0.44 of a core under a 0.25 pacer, 0.25 on the main thread).
    The running thread, signalled itself, stops at once."""

    def __init__(self, procs_files: list[Path]):
        self.files = procs_files
        self._seen: dict[int, tuple[bool, float]] = {}
        self._tids: dict[int, tuple[list[int], float]] = {}
        self._tgkill = _tgkill()

    def _is_paced(self, pid: int, now: float) -> bool:
        known = self._seen.get(pid)
        if known is not None and (known[0] or now - known[1] < _RECHECK_S):
            return known[0]
        try:
            with open(f"/proc/{pid}/comm") as fh:
                paced = not fh.read().startswith(_SKIP)
        except OSError:
            paced = False
        if len(self._seen) > 4096:
            self._seen.clear()
        self._seen[pid] = (paced, now)
        return paced

    def _threads(self, pid: int, now: float) -> list[int]:
        known = self._tids.get(pid)
        if known is not None and now - known[1] < _RECHECK_S:
            return known[0]
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            tids = []
        if len(self._tids) > 4096:
            self._tids.clear()
        self._tids[pid] = (tids, now)
        return tids

    def used(self, pids: list[int], last: dict[int, int]) -> float:
        """CPU seconds the processes ``pids`` used since the last call (``last``: each
        PID's previous reading, updated; a process seen for the first time counts 0)."""
        total = 0
        seen = {}
        for pid in pids:
            try:
                now = time.clock_gettime_ns(cpu_clock_id(pid))
            except OSError:  # gone
                continue
            total += now - last.get(pid, now)
            seen[pid] = now
        last.clear()
        last.update(seen)
        return total / 1e9

    def send(self, pids: list[int], sig: int) -> None:
        now = time.monotonic()
        for pid in pids:
            if sig == signal.SIGSTOP and self._tgkill is not None:
                for tid in self._threads(pid, now):
                    self._tgkill(pid, tid, sig)  # a thread gone by now: ESRCH, ignored
                continue
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def runnable(self, pids: list[int]) -> bool:
        """Whether a thread of the processes ``pids`` is running or waiting for a CPU."""
        now = time.monotonic()
        for pid in pids:
            for tid in self._threads(pid, now):
                try:
                    with open(f"/proc/{pid}/task/{tid}/stat", "rb") as fh:
                        if fh.read().rsplit(b")", 1)[1][1:2] == b"R":
                            return True
                except OSError:
                    continue
        return False

    def pids(self, i: int) -> list[int]:
        now = time.monotonic()
        with open(self.files[i]) as fh:
            return [p for p in map(int, fh.read().split()) if self._is_paced(p, now)]

    def continue_all(self) -> None:
        for i in range(len(self.files)):
            try:
                self.send(self.pids(i), signal.SIGCONT)
            except OSError:
                pass


def _ticker(cpu: int, start: float, tick: float, stop: list) -> None:
    """Wake on ``cpu`` just before each of the pacer's ticks. A real-time wake-up preempts
    the thread running there, and that context switch brings the thread's CPU time up to
    date: the kernel adds a running thread's time to its process's clock only at its own
    tick (4 ms at HZ=250) or a context switch, and read from outside, the clock of a host
    computing on the other CPU showed 0 ms for several 0.5 ms ticks, then 1-4 ms at once
    (which held a 0.6 host to 0.42 of a core)."""
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:
        return
    nxt = start
    while not stop:
        nxt += tick
        delay = nxt - _LEAD_S - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        elif delay < -tick:  # far behind: skip ahead
            nxt += tick * int(-delay / tick)


def run(procs_files: list[Path], fractions: list[float], period_us: int,
        alive: Path | None = None, holds: Path | None = None) -> None:
    """Pace the hosts until a signal, an error, or ``alive`` (a file) disappearing;
    each stop goes to the ``holds`` file (:class:`HoldLog`)."""
    hosts = _Hosts(procs_files)
    log = HoldLog(holds, [str(f.parent) for f in procs_files])
    stop = []

    def on_signal(signum, _frame):
        stop.append(signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
    except (OSError, AttributeError):
        try:
            os.nice(-20)
        except OSError:
            pass
    tick = period_us / 1e6
    cpus = sorted(os.sched_getaffinity(0))
    start = time.perf_counter()
    for cpu in cpus[1:]:
        threading.Thread(target=_ticker, args=(cpu, start, tick, stop), daemon=True).start()
    try:
        os.sched_setaffinity(0, {cpus[0]})  # this thread only (Linux)
    except OSError:
        pass
    paced = [i for i, f in enumerate(fractions) if f < 1.0]
    credit = {i: Credit(fractions[i], fractions[i] * tick) for i in paced}
    resume = {i: resume_level(fractions[i], tick) for i in paced}
    stopped = {i: False for i in paced}
    since = dict.fromkeys(paced, 0.0)  # when each stopped host was stopped
    known: dict[int, set[int]] = {i: set() for i in paced}
    last: dict[int, dict[int, int]] = {i: {} for i in paced}
    # a full collection of this process (about 15,000 objects) takes ~5 ms, four ticks
    # in which no host is stopped or continued: collect now, and freeze what is left
    heap.activate()
    heap.settle()
    # lab up waits for this line before it measures what the hosts get: measured while
    # the pacer was still starting, a 0.25 host's busy loop got 0.28 of a core
    print(f"{READY} {os.getpid()}: {len(paced)} host(s), {period_us} us tick", file=sys.stderr,
          flush=True)
    try:
        if not paced:
            while not stop:
                time.sleep(_CHECK_S)
            return
        check = time.perf_counter() + _CHECK_S
        flush = time.perf_counter() + HOLDS_FLUSH_S
        last_t = {i: time.perf_counter() for i in paced}
        nxt = start + tick
        while not stop:
            # wake at the next tick, or sooner where a stopped host's credit comes back:
            # held to the tick, a host that overran by 0.4 ms sat out a whole tick while
            # a CPU idled (three busy 0.6 hosts got 0.49, 0.49 and 0.60 of a core)
            wake = wake_at(nxt, [(last_t[i], credit[i].value, fractions[i], resume[i])
                                 for i in paced if stopped[i]])
            delay = wake - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            now = time.perf_counter()
            on_tick = now >= nxt - _LEAD_S
            if on_tick:
                nxt += tick
                if nxt < now:  # behind (the machine was busy): skip the missed ticks
                    nxt += tick * (int((now - nxt) / tick) + 1)
            for i in paced:
                if not on_tick and not stopped[i]:
                    # a running host's clock is current only at the tick (see _ticker)
                    continue
                pids = hosts.pids(i)
                new = [p for p in pids if p not in known[i]]
                known[i] = set(pids)
                used = hosts.used(pids, last[i])
                value = credit[i].update(now - last_t[i], used, not stopped[i],
                                         lambda pids=pids: hosts.runnable(pids))
                last_t[i] = now
                if value < 0 and not stopped[i]:
                    hosts.send(pids, signal.SIGSTOP)
                    stopped[i], since[i] = True, time.perf_counter()
                elif stopped[i] and value >= resume[i] - _EPS_S:
                    hosts.send(pids, signal.SIGCONT)
                    stopped[i] = False
                    log.add(i, since[i], time.perf_counter())
                elif stopped[i] and new:
                    hosts.send(new, signal.SIGSTOP)  # started while its host is stopped
            if now >= flush:
                flush = now + HOLDS_FLUSH_S
                log.flush()
            if now >= check:
                check = now + _CHECK_S
                if (alive is not None and not alive.exists()) or not all(
                        f.exists() for f in procs_files):
                    return
    finally:
        hosts.continue_all()
        for i in paced:
            if stopped[i]:
                log.add(i, since[i], time.perf_counter())
        log.flush()


_ENTRY = "import sys; from app_api.lab.pacer import main; sys.exit(main(sys.argv[1:]))"


def command(hosts: list[tuple[str, float]], period_us: int, alive: Path,
            holds: Path | None = None) -> list[str]:
    """The pacer's command line: ``hosts`` are (cgroup directory, fraction)."""
    return [sys.executable, "-c", _ENTRY, "--period-us", str(int(period_us)),
            "--alive", str(alive), *(["--holds", str(holds)] if holds else []),
            *[f"{f:g}={d}" for d, f in hosts]]


def start(hosts: list[tuple[str, float]], period_us: int, alive: Path, log_path: Path,
          holds: Path | None = None) -> int:
    """Start the pacer in its own session (Ctrl-C on ``lab up`` must not stop it); its PID."""
    return start_helper(command(hosts, period_us, alive, holds), log_path)


def is_ours(pid: int | None, alive: Path) -> bool:
    """True if ``pid`` is a pacer started for the lab whose state file is ``alive``."""
    return helper_is_ours(pid, _ENTRY, alive)


def find(alive: Path) -> list[int]:
    """PIDs of every pacer of the lab whose state file is ``alive`` (for a lost state)."""
    return find_helpers(_ENTRY, alive)


def continue_pids(pids: list[int]) -> None:
    """SIGCONT each PID (a host left stopped by a pacer that was killed)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tracr-lab-pacer",
                                 description="hold lab hosts to their fraction of CPU time")
    ap.add_argument("--period-us", type=int, default=DEFAULT_PERIOD_US)
    ap.add_argument("--alive", type=Path, default=None,
                    help="exit (continuing every host) once this file is gone")
    ap.add_argument("--holds", type=Path, default=None,
                    help="write each stop of a host to this file (see HoldLog)")
    ap.add_argument("hosts", nargs="+", metavar="FRACTION=CGROUP_DIR")
    args = ap.parse_args(argv)
    fractions, files = [], []
    for item in args.hosts:
        f, _, d = item.partition("=")
        fractions.append(float(f))
        files.append(Path(d) / "cgroup.procs")
    run(files, fractions, args.period_us, args.alive, args.holds)
    return 0

