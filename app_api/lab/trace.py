"""A link's capacity against time: a fixed rate, or a trace that repeats.

Every schedule is a *capacity function* ``C(t)``: the bytes the link can have sent by
``t`` seconds after the link started. The emulator's rate stage (:mod:`app_api.lab.pipe`)
asks two things of it: how much capacity passed before ``t`` (unused capacity is lost
while the queue is empty) and when a given amount of capacity is reached (a packet's
departure). Bytes are frame bytes, Ethernet header included, as ``tc`` counts them.

Two trace formats load, a user's recorded traces included:

- **Mahimahi** (``*.trace``, any file whose lines are single integers): one line per
  delivery opportunity, the time in ms since the start; each opportunity sends one
  1500-byte IP packet (a 1514-byte frame; a smaller packet uses part of it). Lines may
  repeat (two opportunities in one ms). The trace repeats with a period of its last time,
  as in Mahimahi.
- **CSV** ``time_s,rate``: from each row's time the link runs at its rate, until the next
  row; the last row lasts as long as the step before it, then the trace repeats. A rate
  is anything :func:`app_api.units.parse_rate` reads (``16Mbit``, ``2MB/s``); a bare
  number takes the unit in the header's second column (``time_s,Mbit``), else bytes/s.
  ``#`` starts a comment.

Synthetic traces ship as names (:data:`SYNTHETIC`), generated deterministically around
the link's ``--bandwidth`` R (:func:`synthetic`): ``steady`` (R), ``step`` (1.5R and 0.5R,
5 s each), ``sawtooth`` (0.2R up to 1.8R over 10 s in 0.5 s steps), ``walk`` (a random
walk in log-rate, 0.5 s steps over 60 s, seed 0, between R/sqrt(5) and R*sqrt(5): 5x swings).
"""

from __future__ import annotations

import bisect
import math
import random
from pathlib import Path

from app_api.units import parse_rate
from experiment_design.errors import TracrError

#: bytes of one Mahimahi delivery opportunity: a 1500-byte IP packet in its Ethernet frame
OPPORTUNITY_BYTES = 1514
SYNTHETIC = ("steady", "step", "sawtooth", "walk")


class FixedRate:
    """``rate`` bytes/s for ever."""

    def __init__(self, rate_Bps: float) -> None:
        if not rate_Bps > 0:
            raise TracrError(f"a link rate must be positive, not {rate_Bps} bytes/s")
        self.rate = float(rate_Bps)
        self.period = None

    def before(self, t: float) -> float:
        """Capacity (bytes) that passed before ``t``."""
        return self.rate * max(0.0, t)

    def time_of(self, u: float) -> float:
        """When the capacity reaches ``u`` bytes."""
        return u / self.rate

    def rate_at(self, t: float) -> float:
        """The rate in bytes/s at ``t`` (for the timeline)."""
        return self.rate

    def steps(self) -> list[tuple[float, float]]:
        """``(start_s, rate_Bps)`` of each step in one period."""
        return [(0.0, self.rate)]


class Opportunities:
    """A Mahimahi trace: delivery opportunities at ms times, repeating every ``period``."""

    def __init__(self, times_ms: list[int], size: int = OPPORTUNITY_BYTES) -> None:
        if not times_ms:
            raise TracrError("the trace has no delivery opportunities")
        times = sorted(int(t) for t in times_ms)
        if times[0] < 0 or times[-1] <= 0:
            raise TracrError("a Mahimahi trace needs times in ms that end after 0")
        self.times = [t / 1000 for t in times]
        self.period = times[-1] / 1000
        self.size = size
        self.n = len(times)

    def before(self, t: float) -> float:
        if t <= 0:
            return 0.0
        loops, rest = divmod(t, self.period)
        return self.size * (loops * self.n + bisect.bisect_left(self.times, rest))

    def time_of(self, u: float) -> float:
        if u <= 0:
            return 0.0
        index = math.ceil(u / self.size) - 1  # the opportunity that carries byte u
        loops, i = divmod(index, self.n)
        return loops * self.period + self.times[i]

    def rate_at(self, t: float, window: float = 0.1) -> float:
        return (self.before(t + window) - self.before(t)) / window

    def steps(self, window: float = 0.1) -> list[tuple[float, float]]:
        """The mean rate in each ``window`` (100 ms) of one period."""
        n = max(1, round(self.period / window))
        w = self.period / n
        return [(k * w, (self.before((k + 1) * w) - self.before(k * w)) / w) for k in range(n)]


class Piecewise:
    """Piecewise-constant rates: ``rows`` of (start_s, bytes/s), repeating every ``period``."""

    def __init__(self, rows: list[tuple[float, float]], period: float | None = None) -> None:
        rows = sorted((float(t), float(r)) for t, r in rows)
        if not rows:
            raise TracrError("the trace has no rows")
        if rows[0][0] != 0:
            rows.insert(0, (0.0, rows[0][1]))
        if any(r < 0 for _, r in rows):
            raise TracrError("a trace rate cannot be negative")
        if period is None:
            last = rows[-1][0] - rows[-2][0] if len(rows) > 1 else 1.0
            period = rows[-1][0] + last
        self.starts = [t for t, _ in rows]
        self.rates = [r for _, r in rows]
        self.period = float(period)
        # cumulative capacity at each row's start, and over a whole period
        self.cum = [0.0]
        for i in range(1, len(rows)):
            self.cum.append(self.cum[-1] + self.rates[i - 1] * (self.starts[i] - self.starts[i - 1]))
        self.total = self.cum[-1] + self.rates[-1] * (self.period - self.starts[-1])
        if not self.total > 0:
            raise TracrError("the trace never delivers anything (every rate is 0)")

    def before(self, t: float) -> float:
        if t <= 0:
            return 0.0
        loops, rest = divmod(t, self.period)
        i = bisect.bisect_right(self.starts, rest) - 1
        return loops * self.total + self.cum[i] + self.rates[i] * (rest - self.starts[i])

    def time_of(self, u: float) -> float:
        if u <= 0:
            return 0.0
        loops, rest = divmod(u, self.total)
        if rest == 0:  # exactly at a period's end: the last byte went at the end of the last
            loops, rest = loops - 1, self.total  # step with a rate
        i = bisect.bisect_left(self.cum, rest) - 1  # cum[i] < rest <= cum[i + 1]: rate > 0
        return loops * self.period + self.starts[i] + (rest - self.cum[i]) / self.rates[i]

    def rate_at(self, t: float) -> float:
        rest = t % self.period
        return self.rates[bisect.bisect_right(self.starts, rest) - 1]

    def steps(self) -> list[tuple[float, float]]:
        return list(zip(self.starts, self.rates, strict=True))


def parse_mahimahi(text: str) -> Opportunities:
    """A Mahimahi trace from its text (one integer ms per line)."""
    times = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if not line.isdigit():
            raise TracrError(f"line {n} of the Mahimahi trace is not a time in ms: {line!r}",
                             hint="one integer per line: the ms of each 1500-byte opportunity")
        times.append(int(line))
    return Opportunities(times)


def parse_csv(text: str) -> Piecewise:
    """A ``time_s,rate`` trace from its text (see the module's docstring)."""
    unit = ""
    rows = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 2:
            raise TracrError(f"line {n} of the CSV trace has no rate: {raw!r}",
                             hint="write rows as time_s,rate, e.g. 0,16Mbit")
        try:
            t = float(cells[0])
        except ValueError:
            if rows:
                raise TracrError(
                    f"line {n} of the CSV trace: {cells[0]!r} is not a time in s") from None
            unit = _header_unit(cells[1])
            continue
        cell = cells[1]
        if unit and _is_number(cell):
            cell = f"{cell}{unit}"
        # 0 is an outage (parse_rate takes only positive rates)
        rows.append((t, 0.0 if _is_number(cell) and float(cell) == 0 else parse_rate(cell)))
    return Piecewise(rows)


def _header_unit(column: str) -> str:
    """The rate unit a CSV header's rate column names (``Mbit``, ``rate_MB/s``), or ''."""
    unit = column.split("_")[-1]
    try:
        parse_rate(f"1{unit}")
    except TracrError:
        return ""
    return unit


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def synthetic(name: str, rate_Bps: float, seed: int = 0) -> Piecewise:
    """The shipped trace ``name`` around ``rate_Bps`` (see the module's docstring)."""
    r = float(rate_Bps)
    if name == "steady":
        return Piecewise([(0, r)], period=10.0)
    if name == "step":
        return Piecewise([(0, 1.5 * r), (5, 0.5 * r)], period=10.0)
    if name == "sawtooth":
        return Piecewise([(0.5 * k, r * (0.2 + 1.6 * k / 19)) for k in range(20)], period=10.0)
    if name == "walk":
        rng = random.Random(seed)
        lo, hi = math.log(r / math.sqrt(5)), math.log(r * math.sqrt(5))
        x, rows = math.log(r), []
        for k in range(120):
            rows.append((0.5 * k, math.exp(x)))
            x += rng.gauss(0, 0.15 * (hi - lo))
            x = 2 * lo - x if x < lo else 2 * hi - x if x > hi else x  # reflect at the bounds
            x = min(hi, max(lo, x))
        return Piecewise(rows, period=60.0)
    raise TracrError(f"unknown trace {name!r}; the shipped ones are {', '.join(SYNTHETIC)}",
                     hint="or give the path of a Mahimahi (.trace) or time_s,rate CSV file")


def load(spec: str, rate_Bps: float | None = None):
    """A schedule from ``spec``: a shipped name (needs ``rate_Bps``) or a trace file."""
    if spec in SYNTHETIC:
        if not rate_Bps:
            raise TracrError(f"the shipped trace {spec!r} is scaled to --bandwidth; give one")
        return synthetic(spec, rate_Bps)
    path = Path(spec).expanduser()
    try:
        text = path.read_text()
    except OSError as exc:
        raise TracrError(f"cannot read the trace {spec!r}: {exc.strerror or exc}",
                         hint=f"a shipped trace ({', '.join(SYNTHETIC)}) or a trace file") from None
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if first.isdigit() and "," not in text:
        return parse_mahimahi(text)
    return parse_csv(text)


def schedule(rate_Bps: float | None, trace: str | None):
    """The schedule of a link: its trace, else its fixed rate, else None (unlimited)."""
    if trace:
        return load(trace, rate_Bps)
    return FixedRate(rate_Bps) if rate_Bps else None
