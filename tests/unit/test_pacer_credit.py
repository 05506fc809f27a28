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
