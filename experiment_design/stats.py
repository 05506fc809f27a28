"""The bootstrap of a median, shared by the device (cyclic's race) and the results.

Runs on the device between inferences, so it is vectorised (numpy, which torchvision
already needs): 1000 resamples of 50 latencies take about a millisecond. The race used to
draw them one by one in Python (about 10 ms per contender each round), and on an edge
held to a quarter of a core that cost ran, four times slower, in the quota budget of the
very next timed inference.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

#: resamples per bootstrap: the interval's ends move by well under 1% between seeds
RESAMPLES = 1000
CONFIDENCE = 0.95


def clean(values: Sequence[float]) -> list[float]:
    """The finite values of ``values`` as floats (None, NaN and inf left out)."""
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def mad(values: Sequence[float]) -> float | None:
    """Median absolute deviation from the median (unscaled); None for no values."""
    xs = clean(values)
    if not xs:
        return None
    m = statistics.median(xs)
    return statistics.median(abs(x - m) for x in xs)


def bootstrap_medians(values: Sequence[float], seed: Sequence[int] | int,
                      resamples: int = RESAMPLES) -> Any:
    """``resamples`` medians of ``values`` resampled with replacement (a numpy array), the
    RNG seeded by ``seed`` (an int or a list of ints); None with fewer than two values."""
    import numpy as np

    xs = np.asarray(clean(values), dtype=float)
    if len(xs) < 2:
        return None
    rng = np.random.default_rng(list(seed) if isinstance(seed, (list, tuple)) else seed)
    return np.median(xs[rng.integers(0, len(xs), size=(resamples, len(xs)))], axis=1)


def interval(boot: Any, confidence: float = CONFIDENCE) -> list[float]:
    """``[lo, hi]``: the central ``confidence`` share of the bootstrap draws ``boot``."""
    import numpy as np

    tail = (1.0 - confidence) / 2
    lo, hi = np.quantile(boot, [tail, 1.0 - tail])
    return [float(lo), float(hi)]


def separated(slower: Sequence[float], best: Sequence[float], seed: Sequence[int],
              confidence: float = CONFIDENCE, resamples: int = RESAMPLES) -> bool:
    """Whether median(``slower``) - median(``best``) is above zero at ``confidence``: the
    whole percentile-bootstrap interval of the difference (each sample resampled on its
    own, streams seeded by ``seed`` + [0] and + [1]) lies above 0. False with fewer than
    two values on either side."""
    a = bootstrap_medians(slower, [*seed, 0], resamples)
    b = bootstrap_medians(best, [*seed, 1], resamples)
    if a is None or b is None:
        return False
    return interval(a - b, confidence)[0] > 0.0
