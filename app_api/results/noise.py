"""How far the measured oracle itself moves with measurement noise (split-half regret).

A partitioner is scored against the sweep's measured best (:mod:`app_api.results.scoring`);
that best rests on a finite number of repeats. Dealing each split's repeats into two
halves and scoring one half's best on the other says how large a regret the noise alone
gives: a partitioner's regret near this figure cannot be told from a perfect choice.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence


def pair_samples(rows: Iterable[Mapping]) -> dict[tuple[int, str], list[float]]:
    """``{(split, transport label): [e2e ms, ...]}`` of a run's successful inference rows."""
    out: dict[tuple[int, str], list[float]] = {}
    for r in rows:
        if not r.get("error") and r.get("e2e_ms") is not None:
            out.setdefault((int(r["split"]), str(r.get("transport") or "")), []).append(
                float(r["e2e_ms"]))
    return out


def split_half_regret(e2e_by_split: Mapping[int, Sequence[float]]) -> dict | None:
    """How far the measured oracle itself moves with measurement noise.

    The repeats of every split are dealt into two halves (alternately, in the order
    they ran); the split with the lowest median in one half is scored on the other
    half, as a regret (its median there / that half's best median), both ways round.
    A partitioner's regret near this figure cannot be told from a perfect choice at
    this number of repeats. The halves' medians rest on about half the repeats, so
    the figure over-states the noise of the full medians somewhat. None with fewer
    than two splits measured at least twice.
    """
    halves: list[dict[int, float]] = [{}, {}]
    for k, values in e2e_by_split.items():
        vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
        if len(vals) < 2:
            continue
        for h in (0, 1):
            part = sorted(vals[h::2])
            halves[h][int(k)] = (part[(len(part) - 1) // 2] + part[len(part) // 2]) / 2
    if len(halves[0]) < 2:
        return None

    def score(a: dict[int, float], b: dict[int, float]) -> float:
        k = min(a, key=lambda i: (a[i], i))
        return b[k] / min(b.values())

    ab, ba = score(halves[0], halves[1]), score(halves[1], halves[0])
    reps = [len(v) for v in e2e_by_split.values()]
    return {"regret": (ab + ba) / 2, "a_on_b": ab, "b_on_a": ba, "splits": len(halves[0]),
            "repeats_min": min(reps), "repeats_max": max(reps)}


def measurement_noise(rows: Iterable[Mapping]) -> dict | None:
    """:func:`split_half_regret` of a run's inference rows (failed ones left out).

    Where some splits were measured more than others (cyclic's ``refine`` or ``race``:
    the contenders), ``contenders`` is the same figure over those splits alone. The
    walk's splits have a sample or two per half, and a lucky one among a hundred such
    halves wins a half without being in the running for the whole run: the headline
    figure counts that winner's curse, ``contenders`` the noise of the final choice.
    """
    by_split: dict[int, list[float]] = {}
    for r in rows:
        if not r.get("error") and r.get("e2e_ms") is not None:
            by_split.setdefault(int(r["split"]), []).append(float(r["e2e_ms"]))
    out = split_half_regret(by_split)
    if out and out["repeats_max"] > out["repeats_min"]:
        more = {k: v for k, v in by_split.items() if len(v) > out["repeats_min"]}
        out["contenders"] = split_half_regret(more)
    return out


def pair_noise(rows: Iterable[Mapping], pairs: Sequence[Mapping], floor: float) -> dict | None:
    """:func:`split_half_regret` over the (split, transport) pairs whose measured top-1
    agreement is at least ``floor``: how far the oracle a pair-choosing partitioner is
    scored against moves with measurement noise (``pairs``: ``summary["codecs"]["pairs"]``).
    None with fewer than two such pairs measured twice."""
    keys = sorted((int(p["split"]), str(p["transport"])) for p in pairs
                  if p.get("top1_agreement") is not None and p["top1_agreement"] >= floor)
    samples = pair_samples(rows)
    out = split_half_regret({i: samples.get(k, []) for i, k in enumerate(keys)})
    if out is None:
        return None
    out["pairs"] = out.pop("splits")
    out["floor"] = floor
    return out
