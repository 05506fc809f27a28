"""The pacer's credit: a host earns its fraction of the wall time, pays the CPU time it
used, and cannot save up while idle."""

from __future__ import annotations

import os
import time

import pytest

from app_api.lab import pacer


def _simulate(fraction: float, demand: list[bool], tick: float = 0.5) -> list[bool]:
    """Which ticks a host runs in, given whether it has work in each tick."""
    credit, stopped, ran = 0.0, False, []
    for busy in demand:
        run = busy and not stopped
        ran.append(run)
        credit = pacer.step(credit, fraction, tick, tick if run else 0.0, fraction * tick)
        stopped = credit < 0
    return ran


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.6])
def test_a_busy_host_gets_its_fraction(fraction):
    ran = _simulate(fraction, [True] * 4000)
    assert sum(ran) / len(ran) == pytest.approx(fraction, abs=0.01)


def test_an_idle_host_saves_up_no_burst():
    # idle for 100 ticks, then busy: it runs one tick at full speed at most, then its share
    ran = _simulate(0.25, [False] * 100 + [True] * 400)[100:]
    assert ran[:2] == [True, False]
    assert sum(ran[:8]) <= 3
    assert sum(ran) / len(ran) == pytest.approx(0.25, abs=0.01)


def test_time_a_host_waited_for_is_not_charged():
    assert pacer.step(0.0, 0.5, 1.0, 0.0, 0.5) == 0.5  # earned, capped at the depth
    assert pacer.step(0.5, 0.5, 1.0, 1.0, 0.5) == 0.0


def test_the_cpu_clock_of_another_process_is_read_up_to_date():
    c0 = time.clock_gettime_ns(pacer.cpu_clock_id(os.getpid()))
    t = time.process_time_ns()
    while time.process_time_ns() - t < 5_000_000:
        pass
    assert time.clock_gettime_ns(pacer.cpu_clock_id(os.getpid())) - c0 >= 5_000_000


def test_the_pacer_tick_is_range_checked():
    from app_api.lab.lifecycle import pacer_period_us
    from experiment_design.errors import TracrError

    assert pacer_period_us(None) == 1000 and pacer_period_us(2) == 2000
    for bad in (0.1, 20):
        with pytest.raises(TracrError, match="--cpu-period-ms"):
            pacer_period_us(bad)


def test_a_stopped_host_is_woken_when_its_credit_is_back_not_at_the_next_tick():
    # Held to the tick, a 0.6 host that overran by 0.4 ms sat out the whole next tick while
    # a CPU idled: three busy 0.6 hosts on two CPUs got 0.49, 0.49 and 0.60 of a core.
    tick_at = 10.002
    assert pacer.wake_at(tick_at, []) == tick_at
    # updated at t = 10.000 with -0.4 ms of credit, continued at 0: after 0.4 / 0.6 ms
    assert pacer.wake_at(tick_at, [(10.0, -0.4e-3, 0.6, 0.0)]) == \
        pytest.approx(10.0 + 0.4e-3 / 0.6)
    # continued once a tick's credit is back (0.6 ms): after 1.0 / 0.6 ms
    assert pacer.wake_at(10.005, [(10.0, -0.4e-3, 0.6, 0.6e-3)]) == \
        pytest.approx(10.0 + 1.0e-3 / 0.6)
    # the earliest of several; one that is owed more than a tick waits for the tick
    assert pacer.wake_at(tick_at, [(10.0, -3e-3, 0.6, 0.0), (10.0, -0.1e-3, 0.25, 0.0)]) == \
        pytest.approx(10.0004)
    assert pacer.wake_at(tick_at, [(10.0, -3e-3, 0.6, 0.0)]) == tick_at


def _stops_per_tick(fraction: float, level: float, ticks: int = 2000) -> tuple[float, float]:
    """A host busy all the time under the pacer's rules, event by event (ticks, and the
    wake-ups wake_at asks for); its share of CPU time and its stops per tick."""
    tick, t, credit, last, stopped, ran, stops = 1e-3, 0.0, 0.0, 0.0, False, 0.0, 0
    nxt = tick
    while t < ticks * tick:
        wake = pacer.wake_at(nxt, [(last, credit, fraction, level)] if stopped else [])
        used = 0.0 if stopped else wake - t
        ran += used
        t = wake
        on_tick = t >= nxt - 1e-12
        if on_tick:
            nxt += tick
        if not (on_tick or stopped):
            continue
        credit = pacer.step(credit, fraction, t - last, used if not stopped else 0.0,
                            fraction * tick)
        last = t
        if credit < 0 and not stopped:
            stopped, stops = True, stops + 1
        elif stopped and credit >= level - 1e-12:
            stopped = False
    return ran / t, stops / ticks


@pytest.mark.parametrize("fraction", [0.25, 0.6, 0.9])
def test_a_busy_host_is_stopped_once_in_several_ticks_not_at_every_tick(fraction):
    # Every stop wakes each thread of the host, on the host's CPU time: continued at 0
    # credit, a busy 0.6 host was stopped at every tick, and with 16 idle threads beside
    # it a pass took 33% more CPU time
    share, rate = _stops_per_tick(fraction, pacer.resume_level(fraction, 1e-3))
    assert share == pytest.approx(fraction, abs=0.01)
    assert rate <= 0.26
    if fraction > 0.5:
        assert _stops_per_tick(fraction, 0.0)[1] > 0.99  # the rule before


def _burst_wall(fraction: float, work: float, credit_of, tick: float = 2.0,
                bursts: int = 400) -> float:
    """Mean wall time x ``fraction`` / CPU time of bursts of ``work`` ms of CPU after idle
    gaps of 5-25 ms (as in the lab test), the pacer looking every ``tick`` ms (0.05 ms
    steps): 1.0 is a CPU ``fraction`` as fast. ``credit_of(dt, used, running)`` is the
    rule."""
    import random

    rng = random.Random(1)
    dt = 0.05
    walls, left, idle, wall = [], 0.0, rng.uniform(5.0, 25.0), 0.0
    stopped, used, since, phase = False, 0.0, 0.0, 0.0
    while len(walls) < bursts:
        since, phase = since + dt, phase + dt
        if left > 0:
            wall += dt
            if not stopped:
                left -= dt
                used += dt
            if left <= 1e-9:
                walls.append(wall * fraction / work)
                left, idle, wall = 0.0, rng.uniform(5.0, 25.0), 0.0
        else:
            idle -= dt
            if idle <= 1e-9:
                left, idle = work, 0.0
        # the pacer looks at a running host at its ticks, at a stopped one as its credit
        # comes back (wake_at)
        if phase >= tick - 1e-9 or stopped:
            credit = credit_of(since, used, not stopped)
            stopped = credit < 0 if not stopped else credit < fraction * tick - 1e-9
            since = used = 0.0
        if phase >= tick - 1e-9:
            phase = 0.0
    return sum(walls) / len(walls)


def test_an_idle_gap_earns_nothing_so_a_lone_burst_runs_evenly_slower():
    # Regression: when idle time earned credit, a burst after an idle gap began with a
    # tick's worth and the debt of its unnoticed start was paid while idle: on a 0.6 host
    # at a 2 ms tick, 7 ms bursts took 0.84 of the wall time a CPU that slow takes.
    f, depth = 0.6, 0.6 * 2.0
    old = [0.0]

    def by_step(dt, used, running):
        old[0] = pacer.step(old[0], f, dt, used, depth)
        return old[0]

    new = pacer.Credit(f, depth)
    assert _burst_wall(f, 7.0, by_step) < 0.9  # 0.83 (0.84 measured in the lab test)
    assert _burst_wall(f, 7.0, new.update) == pytest.approx(1.0, abs=0.05)
    # a busy host, whose credit is the same as before, gets its fraction
    busy, stopped, ran = pacer.Credit(f, depth), False, []
    for _ in range(4000):
        ran.append(not stopped)
        credit = busy.update(0.5, 0.0 if stopped else 0.5, not stopped)
        stopped = credit < 0 if not stopped else credit < depth - 1e-9
    assert sum(ran) / len(ran) == pytest.approx(f, abs=0.02)


def test_a_lull_while_the_host_waits_for_a_cpu_keeps_its_credit():
    # A running host that used nothing for 3 ticks of 2 ms: idle (it earns nothing) unless
    # a thread of it was runnable, i.e. waiting for a CPU (as a stopped host, it earns).
    def after_lull(runnable: bool) -> float:
        c = pacer.Credit(0.6, 1.2)
        c.update(2.0, 2.0, True)  # busy: 1.2 - 2 = -0.8
        for _ in range(3):
            c.update(2.0, 0.0, True, lambda: runnable)
        return c.update(2.0, 1.0, True)  # a burst begins: used 1 ms of its 2 ms

    waited, idled = after_lull(True), after_lull(False)
    assert waited == pytest.approx(1.2)  # earned through the lull, capped at the depth
    # idle: the debt stays and the burst's interval earns on the CPU it used (0.6 of 1 ms)
    # less the idle tail of the busy interval before (nothing: that one used all 2 ms)
    assert idled == pytest.approx(-0.8 + 0.6 - 1.0)
