"""Joules over a window of samples, with an interval, from a counter or from power.

A window needs at least :data:`MIN_SAMPLES` samples inside it; with fewer the figure is
``insufficient`` (a status, never a number), since a 50 ms sampler over a 200 ms window
says little about what happened between its reads.

- A counter (joules since start) is read at the window's ends by linear interpolation
  between the samples around each end. The interval brackets it: at least what the
  counter gained between the first and last sample inside the window, at most what it
  gained between the samples just outside it (a counter never runs backwards).
- Power (watts) is integrated by the trapezoid rule, the ends held at the nearest
  sample. The interval is the sum of each step's lower and upper rectangle: what the
  power could have been between two reads if it moved monotonically between them.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

MIN_SAMPLES = 20


@dataclass(frozen=True)
class EnergyFigure:
    """Joules of one window from one collector, with how they were obtained.

    ``status``: ``ok``, ``unsupported`` (the source cannot be read here: ``reason``) or
    ``insufficient`` (fewer than :data:`MIN_SAMPLES` samples in the window).
    """

    method: str
    label: str
    status: str
    joules: float | None = None
    low: float | None = None
    high: float | None = None
    samples: int = 0
    window_s: float = 0.0
    reason: str = ""

    def per(self, n: int) -> dict:
        """The figure per inference (``n`` inferences in the window), as plain JSON."""
        out: dict = {"method": self.method, "label": self.label, "status": self.status,
                     "samples": self.samples, "window_s": round(self.window_s, 3)}
        if self.reason:
            out["reason"] = self.reason
        if self.status != "ok":
            return out
        out.update(joules=self.joules, joules_interval=[self.low, self.high],
                   watts=self.joules / self.window_s if self.window_s > 0 else None)
        if n > 0:  # a window without inferences (a pipeline's rows lack their times) has none
            out.update(j_per_inference=self.joules / n,
                       interval=[self.low / n, self.high / n], inferences=n)
        return out


def combine(parts: Sequence[EnergyFigure], *, min_samples: int = MIN_SAMPLES
            ) -> EnergyFigure:
    """One figure for a window made of several pieces (a split's blocks of inferences):
    joules and bounds added, samples counted over all of them."""
    if not parts:
        raise ValueError("no pieces to combine")
    first = parts[0]
    n = sum(p.samples for p in parts)
    window = sum(p.window_s for p in parts)
    base = dict(method=first.method, label=first.label, samples=n, window_s=window)
    if n < min_samples or any(p.status != "ok" for p in parts):
        return EnergyFigure(status="insufficient", **base,
                            reason=f"{n} samples in the window, {min_samples} needed")
    return EnergyFigure(status="ok", joules=sum(p.joules for p in parts),
                        low=sum(p.low for p in parts), high=sum(p.high for p in parts), **base)


def _interp(ts: Sequence[float], vs: Sequence[float], t: float) -> float:
    """The counter at ``t``: linear between its neighbours, held at the ends."""
    i = bisect_left(ts, t)
    if i <= 0:
        return vs[0]
    if i >= len(ts):
        return vs[-1]
    t0, t1 = ts[i - 1], ts[i]
    if t1 == t0:
        return vs[i]
    return vs[i - 1] + (vs[i] - vs[i - 1]) * (t - t0) / (t1 - t0)


def integrate(ts: Sequence[float], vs: Sequence[float], kind: str, t0: float, t1: float,
              *, method: str = "", label: str = "measured",
              min_samples: int = MIN_SAMPLES) -> EnergyFigure:
    """Joules from ``t0`` to ``t1`` of samples ``(ts, vs)`` (times ascending, seconds);
    ``kind`` is ``counter`` (joules since start) or ``power`` (watts)."""
    lo_i, hi_i = bisect_left(ts, t0), bisect_right(ts, t1)
    n = hi_i - lo_i
    base = dict(method=method, label=label, samples=n, window_s=max(0.0, t1 - t0))
    if t1 <= t0 or n < min_samples or not ts:
        return EnergyFigure(status="insufficient", **base,
                            reason=f"{n} samples in the window, {min_samples} needed")
    if n == 0:  # a piece of a longer window between two samples: bracketed by them
        before, after = vs[max(lo_i - 1, 0)], vs[min(hi_i, len(vs) - 1)]
        dt = t1 - t0
        if kind == "counter":
            joules = _interp(ts, vs, t1) - _interp(ts, vs, t0)
            return EnergyFigure(status="ok", joules=joules, low=0.0,
                                high=max(after - before, joules), **base)
        mid = _interp(ts, vs, (t0 + t1) / 2)
        return EnergyFigure(status="ok", joules=mid * dt, low=min(before, after) * dt,
                            high=max(before, after) * dt, **base)
    if kind == "counter":
        joules = _interp(ts, vs, t1) - _interp(ts, vs, t0)
        low = vs[hi_i - 1] - vs[lo_i]
        high = vs[min(hi_i, len(vs) - 1)] - vs[max(lo_i - 1, 0)]
        return EnergyFigure(status="ok", joules=joules, low=min(low, joules),
                            high=max(high, joules), **base)
    if kind != "power":
        raise ValueError(f"kind must be 'counter' or 'power', not {kind!r}")
    inside = list(zip(ts[lo_i:hi_i], vs[lo_i:hi_i], strict=True))
    pts = [(t0, vs[lo_i]), *inside, (t1, vs[hi_i - 1])]
    joules = low = high = 0.0
    for (ta, pa), (tb, pb) in zip(pts, pts[1:], strict=False):
        dt = tb - ta
        joules += (pa + pb) / 2 * dt
        low += min(pa, pb) * dt
        high += max(pa, pb) * dt
    return EnergyFigure(status="ok", joules=joules, low=low, high=high, **base)
