"""An online estimate of a link's rate from what recent transfers took.

Every inference that sends ``bytes_encoded`` across the cut and spends ``transfer_ms``
on the wire (the head's ``inferences.csv`` row: the end-to-end time less both sides'
compute, encode and decode) is one sample of the link; so is a short probe of the data
channel. A sample's goodput is its bytes over its time less one round trip (the
request's first byte and the reply's last one cost a round trip whatever the size).

An inference's wire time carries more than one round trip: the reply with the output,
both ends' per-message work (on a CPU-limited edge, several ms); a sample says what of
its time is such overhead (``overhead_ms``), which the adaptive policy calibrates against
probes.

The estimate is the *harmonic* mean of the goodputs in a sliding window, weighted by
bytes: ``sum(bytes) / sum(ms - rtt)``. That is the rate at which the window's bytes
actually moved, and unlike an arithmetic mean one lucky fast sample does not dominate
it. The window keeps the samples of the last ``window_s`` seconds, at most ``window_n``
of them, and always the newest one (a slow link may give one sample in a window).

Samples that send fewer than ``min_bytes`` teach little about the rate (the round trip
and the per-message costs dominate them) and are not used; a policy that cuts where
little crosses asks for a probe instead (:class:`experiment_design.partitioners.adaptive.
Adaptive`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

#: a transfer's time less the round trip is never taken below this (ms): a sample whose
#: wire time is within the round trip's noise would otherwise read as an infinite rate
MIN_WIRE_MS = 0.05


@dataclass(frozen=True)
class LinkSample:
    """One observation of the link: ``nbytes`` moved in ``ms`` (round trip included), at
    wall time ``t`` (Unix seconds, the head's clock); ``source`` is ``inference`` or
    ``probe``."""

    t: float
    nbytes: int
    ms: float
    source: str = "inference"
    #: what of ``ms`` is not the bytes' time (None: the estimate's round trip)
    overhead_ms: float | None = None

    def wire_ms(self, rtt_ms: float) -> float:
        """The bytes' own time: ``ms`` less its overhead (else ``rtt_ms``)."""
        off = rtt_ms if self.overhead_ms is None else self.overhead_ms
        return max(self.ms - off, MIN_WIRE_MS)

    def goodput_Bps(self, rtt_ms: float) -> float:
        """Bytes per second over the sample's wire time (:meth:`wire_ms`)."""
        return self.nbytes / self.wire_ms(rtt_ms) * 1000.0


class BandwidthEstimate:
    """Windowed, byte-weighted harmonic mean of recent goodputs (see the module doc).

    Example::

        est = BandwidthEstimate(rtt_ms=1.0, window_s=2.0, window_n=8, min_bytes=16384)
        est.add(LinkSample(t=10.0, nbytes=1_000_000, ms=251.0))   # 4 MB/s
        est.value_Bps()   # -> 4000000.0
    """

    def __init__(self, rtt_ms: float, window_s: float, window_n: int, min_bytes: int,
                 initial_Bps: float | None = None) -> None:
        self.rtt_ms = float(rtt_ms)
        self.window_s = float(window_s)
        self.window_n = int(window_n)
        self.min_bytes = int(min_bytes)
        self.initial_Bps = initial_Bps
        self.samples: deque[LinkSample] = deque()
        #: wall time of the newest sample used (None: none yet)
        self.last_t: float | None = None

    def informative(self, s: LinkSample) -> bool:
        """Whether ``s`` sends enough bytes to say something about the rate."""
        return s.nbytes >= self.min_bytes and s.ms > 0

    def add(self, s: LinkSample) -> bool:
        """Take ``s`` into the window if it is informative; True when it was."""
        if not self.informative(s):
            return False
        self.samples.append(s)
        self.last_t = s.t if self.last_t is None else max(self.last_t, s.t)
        self._trim(s.t)
        return True

    def _trim(self, now: float) -> None:
        while len(self.samples) > 1 and (len(self.samples) > self.window_n
                                         or now - self.samples[0].t > self.window_s):
            self.samples.popleft()

    def value_Bps(self) -> float | None:
        """The current estimate (bytes/s): the window's, else the initial one, else None."""
        if not self.samples:
            return self.initial_Bps
        nbytes = sum(s.nbytes for s in self.samples)
        ms = sum(s.wire_ms(self.rtt_ms) for s in self.samples)
        return nbytes / ms * 1000.0

    def age_s(self, now: float) -> float:
        """Seconds since the newest informative sample (infinite with none)."""
        return float("inf") if self.last_t is None else max(0.0, now - self.last_t)
