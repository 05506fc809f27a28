"""How far a split's median latency can be trusted, and which splits tie with the best.

Every median in ``summary.json`` comes with its noise: the median absolute deviation of
the samples and a bootstrap interval of the median (the samples resampled with
replacement, the median of each resample, the central ``confidence`` share of those
medians). The run-level figure is the *best set*: the splits whose median the
measurements cannot separate from the best one's. For each split the difference
``its median - the best median`` is bootstrapped, each split resampled independently; a
split stays in the set unless the whole interval of that difference lies above 0.

The RNG is seeded per split (``[seed, split]``), so a split's interval is the same
whichever other splits were measured, and a summary rebuilt from the same rows is the
same. Each split is compared with the best at ``confidence`` on its own (no correction
for the number of splits): with many splits, one that is truly slower can still be
separated by chance, so the set is, if anything, too small.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from experiment_design.stats import CONFIDENCE, RESAMPLES, mad
from experiment_design.stats import bootstrap_medians as _bootstrap
from experiment_design.stats import clean as _clean
from experiment_design.stats import interval as _interval

SEED = 0

__all__ = ["CONFIDENCE", "RESAMPLES", "SEED", "best_set", "bootstrap_medians", "mad",
           "median_interval"]


def bootstrap_medians(values: Sequence[float], split: int, resamples: int = RESAMPLES,
                      seed: int = SEED) -> Any:
    """``resamples`` medians of ``values`` resampled with replacement (a numpy array), the
    RNG seeded by ``[seed, split]``; None with fewer than two values (nothing to resample)."""
    return _bootstrap(values, [seed, int(split)], resamples)


def median_interval(values: Sequence[float], split: int, confidence: float = CONFIDENCE,
                    resamples: int = RESAMPLES, seed: int = SEED) -> list[float] | None:
    """``[lo, hi]``: the bootstrap ``confidence`` interval of the median of ``values``;
    None with fewer than two values."""
    boot = bootstrap_medians(values, split, resamples, seed)
    return None if boot is None else _interval(boot, confidence)


def best_set(samples: Mapping[int, Sequence[float]], confidence: float = CONFIDENCE,
             resamples: int = RESAMPLES, seed: int = SEED) -> dict | None:
    """The splits not separated from the best (lowest median) at ``confidence``.

    ``samples``: ``{split: [e2e ms, ...]}``. A split measured fewer than twice, or a best
    measured fewer than twice, cannot be separated and stays in the set. Returns
    ``{best, splits (ascending, the best among them), confidence, method, resamples}``,
    or None when no split has a sample.
    """
    clean = {int(k): _clean(v) for k, v in samples.items()}
    clean = {k: v for k, v in clean.items() if v}
    if not clean:
        return None
    medians = {k: statistics.median(v) for k, v in clean.items()}
    best = min(medians, key=lambda k: (medians[k], k))
    boot_best = bootstrap_medians(clean[best], best, resamples, seed)
    members = []
    for k in sorted(clean):
        boot = bootstrap_medians(clean[k], k, resamples, seed)
        if k == best or boot is None or boot_best is None:
            members.append(k)
            continue
        lo, _ = _interval(boot - boot_best, confidence)
        if lo <= 0.0:
            members.append(k)
    pct = f"{confidence:.0%}"
    return {
        "best": best,
        "splits": members,
        "confidence": confidence,
        "resamples": resamples,
        "method": (f"bootstrap of (split median - best median), each split resampled "
                   f"independently ({resamples} resamples, seeded); a split is in the set "
                   f"unless the {pct} interval of the difference lies above 0; splits "
                   "measured fewer than twice stay in"),
    }
