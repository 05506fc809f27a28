"""An adaptive partitioner scored against hindsight, from the run's own inference rows.

The ``adaptive`` partitioner with ``sweep_s`` first cuts at its candidate splits in turn
(the sweep phase), then adapts (the adaptive phase), under the same link trace. The
trace repeats, so each phase is cut into intervals of the *trace's own clock* (the
position in the trace, :class:`TraceClock`): an inference belongs to the interval its
midpoint falls in, whichever phase it ran in, and the same interval of both phases saw
the same link.

Per interval, the *hindsight best* is the fixed split with the lowest median e2e among
the sweep's inferences in that interval (a split needs ``min_samples`` there). Over the
intervals that both phases saw:

* ``hindsight_ms``: the mean over intervals of the per-interval best median;
* ``best_fixed``: the one split with the lowest mean over intervals of its median there
  (a split must be measured in every interval), ``best_fixed_ms`` that mean;
* ``adaptive_ms``: the mean over intervals of the adaptive phase's mean e2e there.

All three weigh every interval the same (each is the same stretch of trace time), so a
fast interval with many inferences does not count more than a slow one; the plain mean
over the adaptive phase's inferences is ``adaptive_mean_ms``. The headline ratios are
``adaptive_over_hindsight`` and ``adaptive_over_best_fixed``. The hindsight figures use
medians, the adaptive one a mean: the tail of the latencies counts against the adaptive
side alone, so ``adaptive_over_hindsight_mean`` compares with the per-interval best
*mean* too. ``hindsight_over_best_fixed`` is the ceiling of what adapting can gain over
the best fixed split on that trace. ``adaptive_over_hindsight_cv`` takes the per-interval
best cross-validated (:func:`cross_validated_best`): among close splits the minimum of
a few samples' medians is the luckiest, not the best.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TraceClock:
    """Wall time (Unix s) to the position in a repeating trace: ``(t - t0) mod period``
    (no period: seconds since ``t0``, for a link that does not repeat or a steady one)."""

    t0: float
    period_s: float | None = None

    def position(self, t: float) -> float:
        """Seconds into the trace at wall time ``t``."""
        d = t - self.t0
        return d % self.period_s if self.period_s else d


def _f(v) -> float | None:
    try:
        out = float(v)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _mid(row: Mapping) -> float | None:
    """Wall time of an inference's midpoint (start + e2e / 2), or None without both."""
    t, e2e = _f(row.get("t_unix")), _f(row.get("e2e_ms"))
    return None if t is None or e2e is None else t + e2e / 2e3


def in_ranges(i: int, ranges: Sequence[Sequence[int]]) -> bool:
    """Whether inference id ``i`` is in one of the sorted ``[first, last]`` ``ranges``."""
    j = bisect.bisect_right([r[0] for r in ranges], i) - 1
    return j >= 0 and i <= ranges[j][1]


def phase_rows(rows: Iterable[Mapping], bounds: Sequence[float | None] | None,
               ids: Sequence[Sequence[int]] | None = None, inside: bool = True) -> list[dict]:
    """The successful rows that started within ``bounds`` ([start, end] wall time); with
    ``ids`` (``[first, last]`` inference id ranges) only those in them (``inside``) or only
    those not."""
    if not bounds or bounds[0] is None:
        return []
    lo, hi = float(bounds[0]), float(bounds[1]) if bounds[1] is not None else math.inf
    return [dict(r) for r in rows if not r.get("error") and _mid(r) is not None
            and lo <= float(r["t_unix"]) <= hi
            and (ids is None or in_ranges(int(r["inference"]), ids) == inside)]


def _by_interval(rows: Iterable[Mapping], clock: TraceClock, interval_s: float
                 ) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in rows:
        out.setdefault(int(clock.position(_mid(r)) // interval_s), []).append(r)
    return out


def cross_validated_best(by_split: Mapping[int, Sequence[float]]) -> float | None:
    """The per-interval best without the winner's curse: the samples of each split dealt
    alternately into two halves (in the order they ran), the split with the lowest median
    in one half scored by its median in the other, both ways round, averaged. The plain
    minimum of the medians is biased low where several splits are close (it picks whichever
    drew the luckiest samples); None unless two splits have two samples in each half."""
    halves = [{k: statistics.median(v[h::2]) for k, v in by_split.items() if len(v) >= 4}
              for h in (0, 1)]
    if len(halves[0]) < 2:
        return None
    out = []
    for a, b in ((halves[0], halves[1]), (halves[1], halves[0])):
        k = min(a, key=lambda j: (a[j], j))
        out.append(b[k])
    return statistics.fmean(out)


def score(rows: Iterable[Mapping], phases: Mapping[str, Sequence[float | None]],
          clock: TraceClock, interval_s: float, min_samples: int = 2,
          rate_of=None, sweep_ids: Sequence[Sequence[int]] | None = None) -> dict:
    """Score the adaptive phase against the sweep phase (see the module doc).

    ``rows``: the run's inference rows (``t_unix``, ``split``, ``e2e_ms``); ``phases``:
    the decision's ``{"sweep": [t0, t1], "adaptive": [t0, t1]}``; ``rate_of(t)``: the
    link's configured rate at wall time t (bytes/s), shown per interval when given;
    ``sweep_ids``: the sweep's inference id ranges when the phases were interleaved (the
    rest of the rows in the adaptive bounds are the adaptive phase's).
    Returns the headline figures and one row per interval; ``error`` says why not when
    the phases share no interval.
    """
    if interval_s <= 0:
        raise ValueError("interval_s must be positive")
    rows = list(rows)
    ids = sorted(map(list, sweep_ids)) if sweep_ids else None
    sweep = _by_interval(phase_rows(rows, phases.get("sweep"), ids), clock, interval_s)
    adapt = _by_interval(phase_rows(rows, phases.get("adaptive"), ids, inside=False), clock,
                         interval_s)
    table, used = [], []
    for key in sorted(set(sweep) | set(adapt)):
        by_split: dict[int, list[float]] = {}
        for r in sweep.get(key, []):
            by_split.setdefault(int(r["split"]), []).append(float(r["e2e_ms"]))
        medians = {k: statistics.median(v) for k, v in by_split.items() if len(v) >= min_samples}
        means = {k: statistics.fmean(v) for k, v in by_split.items() if len(v) >= min_samples}
        mine = adapt.get(key, [])
        best = min(medians, key=lambda k: (medians[k], k)) if medians else None
        row = {"interval": key, "start_s": key * interval_s, "sweep_n": sum(map(len,
               by_split.values())), "adaptive_n": len(mine),
               "best_split": best, "best_ms": medians.get(best),
               "best_mean_ms": min(means.values()) if means else None,
               "best_cv_ms": cross_validated_best(by_split),
               "medians": medians,
               "adaptive_ms": statistics.fmean(float(r["e2e_ms"]) for r in mine) if mine else None,
               "adaptive_splits": sorted({int(r["split"]) for r in mine})}
        if rate_of is not None:
            times = [_mid(r) for r in mine] or [_mid(r) for r in sweep.get(key, [])]
            rates = [v for v in (rate_of(t) for t in times) if v is not None]
            row["rate_Bps"] = statistics.median(rates) if rates else None
        table.append(row)
        if best is not None and mine:
            used.append(row)
    out: dict = {"interval_s": interval_s, "min_samples": min_samples,
                 "interleaved": bool(ids),
                 "period_s": clock.period_s, "intervals": table, "intervals_scored": len(used),
                 "intervals_adaptive": len(adapt), "intervals_sweep": len(sweep)}
    mine_all = [float(r["e2e_ms"]) for v in adapt.values() for r in v]
    out["adaptive_mean_ms"] = statistics.fmean(mine_all) if mine_all else None
    if not used:
        out["error"] = ("no interval of the trace has both sweep and adaptive inferences "
                        f"(sweep {len(sweep)}, adaptive {len(adapt)} intervals)")
        return out
    hindsight = statistics.fmean(r["best_ms"] for r in used)
    adaptive = statistics.fmean(r["adaptive_ms"] for r in used)
    everywhere = set.intersection(*(set(r["medians"]) for r in used))
    fixed = {k: statistics.fmean(r["medians"][k] for r in used) for k in everywhere}
    best_fixed = min(fixed, key=lambda k: (fixed[k], k)) if fixed else None
    by_mean = statistics.fmean(r["best_mean_ms"] for r in used)
    cv = [r["best_cv_ms"] for r in used if r["best_cv_ms"] is not None]
    if len(cv) == len(used):
        out.update(hindsight_cv_ms=statistics.fmean(cv),
                   adaptive_over_hindsight_cv=adaptive / statistics.fmean(cv))
    out.update(hindsight_ms=hindsight, adaptive_ms=adaptive,
               hindsight_mean_ms=by_mean, adaptive_over_hindsight_mean=adaptive / by_mean,
               hindsight_over_best_fixed=hindsight / fixed[best_fixed] if fixed else None,
               fixed_ms=dict(sorted(fixed.items())), best_fixed=best_fixed,
               best_fixed_ms=fixed.get(best_fixed),
               adaptive_over_hindsight=adaptive / hindsight,
               adaptive_over_best_fixed=adaptive / fixed[best_fixed] if fixed else None)
    if not fixed:
        out["notes"] = ["no split was measured in every scored interval: no best fixed split"]
    return out
