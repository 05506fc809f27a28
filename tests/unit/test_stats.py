"""The shared bootstrap of medians (experiment_design/stats.py): the race's separation test
on the device and the summary's intervals use the same code."""

from __future__ import annotations

import random

from experiment_design.stats import bootstrap_medians, interval, mad, separated


def test_separated_needs_the_whole_interval_of_the_difference_above_zero():
    rng = random.Random(1)
    fast = [100 + rng.gauss(0, 2) for _ in range(20)]
    slow = [110 + rng.gauss(0, 2) for _ in range(20)]
    close = [100.5 + rng.gauss(0, 2) for _ in range(20)]
    assert separated(slow, fast, [0, 1])
    assert not separated(close, fast, [0, 1])
    assert not separated(fast, slow, [0, 1])  # faster than the best is never "separated"
    assert not separated([200.0], fast, [0, 1])  # one sample cannot be resampled


def test_the_bootstrap_is_seeded_so_the_same_measurements_give_the_same_answer():
    xs = [float(v) for v in range(1, 30)]
    a, b = bootstrap_medians(xs, [3, 4]), bootstrap_medians(xs, [3, 4])
    assert (a == b).all() and len(a) == 1000
    lo, hi = interval(a, 0.95)
    assert lo < 15.0 < hi
    assert bootstrap_medians([1.0, float("nan")], 0) is None
    assert mad([1.0, 2.0, 4.0, None]) == 1.0 and mad([]) is None
