"""One direction of an emulated link: loss, then a drop-tail queue, then the rate, then delay.

A packet offered at time ``now`` (``Pipe.offer``) is either dropped or given the time it
leaves the far end; the emulator (:mod:`app_api.lab.emulator`) only holds it until then.
Nothing here touches a socket, so every stage is tested on its own:

1. **loss** (:class:`Bernoulli`, or :class:`GilbertElliott`: a good and a bad state with
   ``p`` = P(good -> bad), ``r`` = P(bad -> good), ``h`` = P(delivered | bad) and ``k`` =
   P(delivered | good), as in Gilbert-Elliott's papers; netem's ``loss gemodel p r 1-h 1-k``
   is the same model). A lost packet never takes the link's capacity.
2. **queue**: drop-tail, in bytes or packets; a packet counts until it has left the rate
   stage. Deep by default (16 MiB, as the tbf shaper), so TCP loses nothing to it.
3. **rate**: the link sends packets one after another at its capacity (:mod:`app_api.lab
   .trace`: a fixed rate or a trace); capacity that passes while the queue is empty is
   lost, as on a real link. Bytes are frame bytes (Ethernet header included), as tc counts.
4. **delay**: a fixed one-way delay plus jitter (uniform in +-J, normal with sigma J, or
   pareto: a Pareto(4) tail scaled to sigma J), never below 0 and never reordering (a
   packet leaves no earlier than the one before it; so packets closer together than the
   jitter wait behind one that drew a longer delay, and their mean delay is above the
   configured one, as in netem without reordering).

Every departure is computed when the packet arrives: the link is first-in first-out, so
departure and delivery times only grow, and the emulator holds each direction in a plain
deque.
"""

from __future__ import annotations

import math
import random
import re
from collections import deque
from dataclasses import asdict, dataclass, field

from app_api.lab import trace as traces
from app_api.units import parse_rate
from experiment_design.errors import TracrError

#: default queue depth in bytes: the tbf shaper's (see app_api.lab.network.QUEUE_BYTES)
QUEUE_BYTES = 16 << 20
JITTER_DISTRIBUTIONS = ("uniform", "normal", "pareto")


@dataclass
class LinkConfig:
    """What one direction of a link does to its packets (see the module's docstring)."""

    rate_Bps: float | None = None
    trace: str | None = None
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    jitter_dist: str = "uniform"
    loss: float = 0.0
    ge: tuple[float, float, float, float] | None = None
    queue_bytes: int | None = None
    queue_packets: int | None = None
    extra: dict = field(default_factory=dict)

    def is_plain(self) -> bool:
        """True when only a rate is asked (what tbf does exactly)."""
        return not (self.trace or self.delay_ms or self.jitter_ms or self.loss or self.ge
                    or self.queue_bytes or self.queue_packets)

    def is_empty(self) -> bool:
        """True when the direction does nothing to its packets."""
        return self.is_plain() and not self.rate_Bps

    def mean_loss(self) -> float:
        """The long-run fraction of packets lost."""
        if self.ge:
            return GilbertElliott(*self.ge).mean()
        return self.loss

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ge"] = list(self.ge) if self.ge else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> LinkConfig:
        d = dict(d)
        if d.get("ge"):
            d["ge"] = tuple(float(x) for x in d["ge"])
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def parse_fraction(text: str | float, what: str) -> float:
    """``1%`` -> 0.01, ``0.01`` -> 0.01 (a fraction; with %, a percentage), range-checked."""
    s = str(text).strip()
    try:
        value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise TracrError(f"cannot read the {what} {text!r}", hint="write 1% or 0.01") from None
    if not 0 <= value <= 1:
        raise TracrError(f"the {what} must be between 0 and 100%, not {text!r}")
    return value


def parse_ge(text: str) -> tuple[float, float, float, float]:
    """``ge:p,r[,h,k]`` -> (p, r, h, k); h defaults to 0 (the bad state loses all), k to 1."""
    body = text.split(":", 1)[1] if text.startswith("ge:") else text
    parts = [p for p in body.split(",") if p.strip()]
    if not 2 <= len(parts) <= 4:
        raise TracrError(f"cannot read the loss model {text!r}",
                         hint="ge:p,r[,h,k], e.g. ge:1%,30% (P(good->bad), P(bad->good), "
                         "P(delivered | bad), P(delivered | good))")
    names = ("p", "r", "h", "k")
    values = [parse_fraction(v, f"Gilbert-Elliott {n}") for n, v in zip(names, parts, strict=False)]
    values += [0.0, 1.0][len(values) - 2:]
    if values[0] + values[1] == 0:
        raise TracrError("the Gilbert-Elliott model needs p or r above 0")
    return tuple(values)  # type: ignore[return-value]


def parse_queue(text: str | int | None) -> tuple[int | None, int | None]:
    """``100`` / ``100p`` -> (None, 100 packets); ``150KB`` / ``1MiB`` -> (bytes, None)."""
    if text in (None, ""):
        return None, None
    s = str(text).strip()
    if s.isdigit() or s.lower().endswith(("p", "pkt", "pkts", "packets")):
        n = int(re.sub(r"[a-zA-Z]+$", "", s))
        if n < 1:
            raise TracrError("--queue needs at least 1 packet")
        return None, n

    size = int(parse_rate(s.replace("/s", "") + ("" if s.endswith("B") else "B")))
    if size < 1514:
        raise TracrError(f"--queue {text} is smaller than one full frame (1514 bytes)")
    return size, None


class Bernoulli:
    """Each packet lost with probability ``p``, independently."""

    def __init__(self, p: float, rng: random.Random) -> None:
        self.p, self.rng = p, rng

    def lost(self) -> bool:
        return self.p > 0 and self.rng.random() < self.p


class GilbertElliott:
    """Two-state Markov loss (see the module's docstring); starts in the good state."""

    def __init__(self, p: float, r: float, h: float = 0.0, k: float = 1.0,
                 rng: random.Random | None = None) -> None:
        self.p, self.r, self.h, self.k = p, r, h, k
        self.rng = rng or random.Random(0)
        self.bad = False

    def mean(self) -> float:
        """The long-run loss rate: pi_bad (1-h) + pi_good (1-k)."""
        bad = self.p / (self.p + self.r)
        return bad * (1 - self.h) + (1 - bad) * (1 - self.k)

    def lost(self) -> bool:
        rnd = self.rng.random
        self.bad = (rnd() >= self.r) if self.bad else (rnd() < self.p)
        return rnd() >= (self.h if self.bad else self.k)


class Jitter:
    """The random part of the delay, in seconds, with standard deviation (or half-range) J."""

    def __init__(self, jitter_s: float, dist: str, rng: random.Random) -> None:
        if dist not in JITTER_DISTRIBUTIONS:
            raise TracrError(f"unknown jitter distribution {dist!r}; "
                             f"the valid ones are {', '.join(JITTER_DISTRIBUTIONS)}")
        self.j, self.dist, self.rng = jitter_s, dist, rng

    def sample(self) -> float:
        if not self.j:
            return 0.0
        if self.dist == "uniform":
            return self.rng.uniform(-self.j, self.j)
        if self.dist == "normal":
            return self.rng.gauss(0.0, self.j)
        # Pareto(4): mean 4/3, sigma sqrt(2)/3; centred and scaled to sigma J
        return self.j * (self.rng.paretovariate(4.0) - 4 / 3) / (math.sqrt(2) / 3)


class Pipe:
    """One direction's pipeline; times are ``time.monotonic()`` seconds, ``epoch`` the
    time the link (and its trace) started."""

    def __init__(self, config: LinkConfig, epoch: float, seed: int = 0) -> None:
        self.config = config
        self.epoch = epoch
        rng = random.Random(seed)
        if config.ge:
            self.loss = GilbertElliott(*config.ge, rng=rng)
        else:
            self.loss = Bernoulli(config.loss, rng)
        self.jitter = Jitter(config.jitter_ms / 1000, config.jitter_dist, rng)
        self.delay = config.delay_ms / 1000
        self.schedule = traces.schedule(config.rate_Bps, config.trace)
        self.limit_bytes = config.queue_bytes or (QUEUE_BYTES if not config.queue_packets else None)
        self.limit_packets = config.queue_packets
        self.queued: deque[tuple[float, int]] = deque()  # (departure, size) not yet sent
        self.queued_bytes = 0
        self.used = 0.0  # capacity (bytes since epoch) already given to packets
        self.last_delivery = 0.0
        self.counts = {"offered": 0, "lost": 0, "queue_drops": 0}

    def offer(self, now: float, size: int) -> float | None:
        """The time a ``size``-byte frame arriving ``now`` leaves the link, or None (dropped)."""
        self.counts["offered"] += 1
        if self.loss.lost():
            self.counts["lost"] += 1
            return None
        depart = now
        if self.schedule is not None:
            q = self.queued
            while q and q[0][0] <= now:
                self.queued_bytes -= q.popleft()[1]
            if ((self.limit_bytes is not None and self.queued_bytes + size > self.limit_bytes)
                    or (self.limit_packets is not None and len(q) >= self.limit_packets)):
                self.counts["queue_drops"] += 1
                return None
            t = now - self.epoch
            self.used = max(self.used, self.schedule.before(t)) + size
            depart = self.epoch + self.schedule.time_of(self.used)
            q.append((depart, size))
            self.queued_bytes += size
        deliver = depart + max(0.0, self.delay + self.jitter.sample())
        deliver = max(deliver, self.last_delivery)  # never reorder
        self.last_delivery = deliver
        return deliver
