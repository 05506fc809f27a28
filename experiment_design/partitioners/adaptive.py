"""``adaptive``: re-choose the split while the run goes on, as the link's rate moves.

Neurosurgeon and predicted-argmin choose once, from the link probed at start-up. This
policy predicts, for every candidate split k and a link rate B,

    e2e(k, B) = fixed(k) + crossing_bytes(k) / B + rtt

(``fixed``: the edge's prefix and the cloud's suffix, from the same start-up profiles
predicted-argmin reads, CPU quota models included; see
:mod:`experiment_design.partitioners.predicted`), and cuts at the argmin for its current
estimate of B. The estimate is online (:class:`~experiment_design.partitioners.bandwidth.
BandwidthEstimate`): each inference's bytes and wire time, and, when the current split
sends too little to learn the link from (all on the edge, or a few KB), a short probe of
the data channel every ``probe_every_s`` seconds. An inference's transfer also pays a
per-message overhead beyond its bytes and one round trip (the reply, both ends' work; 4-9
ms on the lab's paced edge): every ``calibrate_every_s`` a probe's rate calibrates it
from the next inference, and the estimate takes it off each sample (without it, a split
sending 36 KB read the link at half its rate). ``fixed`` is corrected by what the
inferences measured: a split seen ``learn_after`` times uses the median of its last
measured ``e2e - transfer``; the others are scaled by the median measured/predicted
ratio of the seen ones.

Hysteresis, so that noise does not make it flap: it switches only after ``confirm``
consecutive estimates in which the best split is predicted at least ``margin`` faster
than the current one, and never sooner than ``dwell_s`` after its last switch.

Hindsight (``sweep_s`` > 0): before adapting, the policy spends ``sweep_s`` seconds
cutting at its candidate splits in turn, ``sweep_block`` inferences each, and ignores
what they measure. Those rows are the yardstick: under the same trace, the best fixed split per
interval of the trace and the best single fixed split (see
``app_api.results.hindsight``). The adaptive phase then lasts ``adapt_s`` seconds
(0: until the task's count) and :meth:`Adaptive.finished` ends the task. The phases'
wall-clock bounds are in the decision. With ``interleave`` the two alternate instead, a
sweep block then an adaptive block, for ``sweep_s + adapt_s`` seconds (the sweep's
inference ids are in the decision, ``sweep_ids``): both then meet the same stretch of the
trace and the same load on the machine, where phases minutes apart may not (on the lab,
split 3's cloud suffix took 65 ms of wall time in a sweep phase and 99 ms in the adaptive
phase two minutes later, for the same 31 ms of CPU).

The decision records every switch (time, estimate, from, to, predicted times, reason),
the probes, and a log with one row per adaptive inference and probe (``log``: the run's
``adaptive.csv``).
"""

from __future__ import annotations

import copy
import difflib
import statistics
from collections import deque
from collections.abc import Mapping
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.params import Param, problems
from experiment_design.partitioners.bandwidth import BandwidthEstimate, LinkSample
from experiment_design.partitioners.base import (
    PartitionContext,
    Partitioner,
    register_partitioner,
)
from experiment_design.partitioners.predicted import PredictedArgmin, crossing_bytes, link

#: the adaptive partitioner's parameters (types, ranges, defaults: experiment_design.params)
PARAMS: dict[str, Param] = {
    "margin": Param("number", default=0.10, min=0.0, max=0.9, doc="switch only when the best "
                    "split is predicted at least this fraction faster than the current one"),
    "confirm": Param("int", default=3, min=1, max=1000,
                     doc="consecutive estimates that must agree before a switch"),
    "dwell_s": Param("number", default=2.0, min=0.0, max=3600.0,
                     doc="minimum seconds between two switches"),
    "window_s": Param("number", default=2.0, min=0.01, max=3600.0,
                      doc="seconds of samples in the rate estimate"),
    "window_n": Param("int", default=8, min=1, max=10000,
                      doc="at most this many samples in the rate estimate"),
    # 32 KiB: on the lab's paced edge a 16 KiB transfer's wire time (5 ms at 3 MB/s) was
    # within the noise of its 4-9 ms per-message overhead, and read 0.2 to 200 MB/s
    "min_bytes": Param("int", default=32768, min=1, max=1 << 30,
                       doc="an inference sending fewer bytes does not teach the rate"),
    "probe_every_s": Param("number", default=3.0, min=0.0, max=3600.0, doc="probe the link "
                           "when no informative sample came for this long (0: never probe)"),
    "probe_bytes": Param("int", default=65536, min=1024, max=64 << 20,
                         doc="bytes one probe sends"),
    "calibrate_every_s": Param("number", default=10.0, min=0.0, max=3600.0, doc="probe at "
                               "least this often to calibrate an inference's per-message "
                               "overhead against the probed rate (0: never)"),
    "learn_after": Param("int", default=3, min=1, max=1000, doc="measured inferences of a "
                         "split before its own median replaces the predicted fixed part"),
    "span": Param("number", default=30.0, min=1.0, max=1e6, doc="splits=auto keeps the splits "
                  "predicted best at some rate within the probed rate / span .. * span"),
    "sweep_s": Param("number", default=0.0, min=0.0, max=86400.0, doc="seconds of the "
                     "hindsight sweep (candidate splits in turn) before adapting; 0: none"),
    "sweep_block": Param("int", default=3, min=1, max=1000, doc="consecutive sweep inferences "
                         "at one split before the next (switching every inference runs colder "
                         "code)"),
    "interleave": Param("bool", default=False, doc="alternate sweep and adaptive blocks "
                        "(sweep_block inferences each) for sweep_s + adapt_s seconds, so both "
                        "meet the same link and the same load on the machine"),
    "adapt_s": Param("number", default=0.0, min=0.0, max=86400.0,
                     doc="seconds of the adaptive phase; 0: until the task's count"),
    "bandwidth_Bps": Param("number", default=None, min=1.0, nullable=True,
                           doc="what-if start-up rate instead of the probed one"),
    "rtt_ms": Param("number", default=None, min=0.0, nullable=True,
                    doc="what-if round trip instead of the probed one"),
    "splits": Param("any", default="auto", doc="'auto' or a list of split indices"),
    "predictor": Param("map", default={}, doc="params of the predicted-argmin model of the "
                       "edge and cloud parts (e.g. {cold: false})"),
}
LOG_LIMIT = 20000  # log rows kept (an hour at 5 inferences/s); the counts keep going


@register_partitioner("adaptive")
class Adaptive(Partitioner):
    """Online split choice with hysteresis (see the module doc for the model).

    Params (all optional; :data:`PARAMS` holds types, ranges and defaults): ``margin``,
    ``confirm``, ``dwell_s`` (hysteresis); ``window_s``, ``window_n``, ``min_bytes``
    (the rate estimate); ``probe_every_s``, ``probe_bytes``, ``calibrate_every_s``
    (probes); ``learn_after``; ``splits`` (``auto``: those predicted best somewhere in
    ``span``; or a list); ``predictor`` (params of the predicted-argmin model of the fixed
    parts); ``sweep_s``, ``sweep_block``, ``adapt_s``, ``interleave`` (hindsight sweep and
    adaptive phase);
    ``bandwidth_Bps`` / ``rtt_ms`` (what-if start-up link).
    """

    needs = frozenset({"edge_profile", "cloud_profile", "network"})

    PARAMS = PARAMS

    def __init__(self, **params: Any) -> None:
        unknown = sorted(set(params) - set(PARAMS))
        if unknown:
            close = difflib.get_close_matches(unknown[0], list(PARAMS), n=1)
            raise TracrError(f"adaptive: unknown parameter(s) {unknown}.",
                             hint=(f"Did you mean {close[0]!r}? " if close else "")
                             + f"The valid options are {sorted(PARAMS)}.")
        for name, problem in problems(type(self), params):
            raise TracrError(f"adaptive: {name} {problem}",
                             hint=f"{name}: {PARAMS[name].describe()}")
        values = {k: params.get(k, copy.deepcopy(p.default)) for k, p in PARAMS.items()}
        if values["probe_every_s"] and values["probe_bytes"] < values["min_bytes"]:
            raise TracrError(f"adaptive: probe_bytes ({values['probe_bytes']}) is below "
                             f"min_bytes ({values['min_bytes']}): a probe would teach nothing",
                             hint="raise probe_bytes or lower min_bytes")
        splits = values["splits"]
        if splits != "auto" and not (isinstance(splits, list) and splits and all(
                isinstance(k, int) and not isinstance(k, bool) for k in splits)):
            raise TracrError(f"adaptive: splits must be 'auto' or a list of split indices, "
                             f"got {splits!r}", hint="e.g. splits: [0, 5, 13, 21]")
        super().__init__(**{k: v for k, v in values.items() if v is not None})
        self.p = values
        self.k: int | None = None
        self.candidates: list[int] = []
        self.phase = ("interleaved" if values["interleave"] else "sweep"
                      if values["sweep_s"] > 0 else "adaptive")
        #: [first, last] inference ids of the sweep's blocks (interleaved)
        self.sweep_ids: list[list[int]] = []
        self._next_n = 0
        self._was_sweep = False
        self.phases: dict[str, list[float | None]] = {}
        self.switches: list[dict] = []
        self.log: list[dict] = []
        self.probes = {"count": 0, "ms": 0.0}
        self._sweep_i = 0
        self._streak = 0
        self._last_switch: float | None = None
        self._now: float | None = None
        self._last_inference: int | None = None
        self._done = False
        self._seen: dict[int, deque[float]] = {}
        #: an inference's transfer time beyond its bytes at the probed rate and one round
        #: trip (the reply, both ends' per-message work), one figure per calibration
        self._overhead: deque[float] = deque(maxlen=9)
        self._probe_rate: float | None = None
        self._last_probe: float | None = None
        self._calibrate_next = False
        self._decision: dict = {}

    # -- set-up ------------------------------------------------------------------------------
    def setup(self, ctx: PartitionContext) -> None:
        """The fixed parts and crossing bytes of every valid split, the candidates, and the
        start-up choice (the argmin at the probed rate)."""
        super().setup(ctx)
        model = PredictedArgmin(**self.params["predictor"],
                                **{k: self.p[k] for k in ("bandwidth_Bps", "rtt_ms")
                                   if self.p[k] is not None})
        model.setup(ctx)
        parts = model.decision()["predicted_parts"]
        bw, rtt, source = link(ctx, {k: self.p[k] for k in ("bandwidth_Bps", "rtt_ms")})
        self.rtt_ms = rtt
        self.cross = crossing_bytes(ctx)
        self.fixed = {int(k): float(v["total_ms"]) - float(v["transfer_ms"])
                      for k, v in parts.items()}
        valid = sorted(self.fixed)
        if self.params["splits"] == "auto":
            self.candidates = self.best_somewhere(bw / self.p["span"], bw * self.p["span"])
        else:
            bad = sorted(set(self.params["splits"]) - set(valid))
            if bad:
                raise TracrError(f"adaptive: split(s) {bad} are not valid split points.",
                                 hint=f"The valid splits are {valid}.")
            self.candidates = sorted(set(self.params["splits"]))
        self.estimate = BandwidthEstimate(rtt, self.p["window_s"], self.p["window_n"],
                                          self.p["min_bytes"], initial_Bps=bw)
        self.k = self.argmin(bw)
        self._decision = {"initial": {"bandwidth_Bps": bw, "rtt_ms": rtt, "source": source,
                                      "chosen": self.k},
                          "fixed_ms": {k: self.fixed[k] for k in self.candidates},
                          "crossing_bytes": {k: self.cross[k] for k in self.candidates}}

    def best_somewhere(self, lo_Bps: float, hi_Bps: float, steps: int = 400) -> list[int]:
        """The valid splits that are the predicted argmin at some rate in [lo, hi] (a log
        grid): the only ones an argmin policy ever picks there."""
        out = set()
        for i in range(steps + 1):
            b = lo_Bps * (hi_Bps / lo_Bps) ** (i / steps)
            out.add(min(self.fixed, key=lambda k: (self.fixed[k] + self.cross[k] / b * 1e3, k)))
        return sorted(out)

    # -- the model -----------------------------------------------------------------------
    def fixed_ms(self, k: int) -> float:
        """Predicted edge + cloud time of split ``k``, corrected by what was measured."""
        seen = self._seen.get(k)
        if seen is not None and len(seen) >= self.p["learn_after"]:
            return statistics.median(seen)
        ratios = [statistics.median(v) / self.fixed[j] for j, v in self._seen.items()
                  if len(v) >= self.p["learn_after"] and self.fixed[j] > 0]
        return self.fixed[k] * (statistics.median(ratios) if ratios else 1.0)

    def overhead_ms(self) -> float:
        """The calibrated per-message overhead of an inference's transfer (0 before any)."""
        return max(0.0, statistics.median(self._overhead)) if self._overhead else 0.0

    def predict(self, bw_Bps: float) -> dict[int, float]:
        """Predicted e2e ms of every candidate at ``bw_Bps`` (the overhead is the same for
        every split: it moves the figures, not the argmin)."""
        extra = self.rtt_ms + self.overhead_ms()
        return {k: self.fixed_ms(k) + self.cross[k] / bw_Bps * 1e3 + extra
                for k in self.candidates}

    def argmin(self, bw_Bps: float) -> int:
        """The candidate with the lowest predicted e2e at ``bw_Bps`` (lowest index on ties)."""
        pred = self.predict(bw_Bps)
        return min(pred, key=lambda k: (pred[k], k))

    # -- the run -------------------------------------------------------------------------
    def next_split(self) -> int:
        """The sweep's next candidate in turn, or the current adaptive choice."""
        if self.k is None:
            raise TracrError("adaptive: next_split() called before setup().")
        block = self.p["sweep_block"]
        self._was_sweep = self.phase == "sweep" or (
            self.phase == "interleaved" and self._next_n % (2 * block) < block)
        self._next_n += 1
        if self._was_sweep:
            k = self.candidates[(self._sweep_i // block) % len(self.candidates)]
            self._sweep_i += 1
            return k
        return self.k

    def finished(self) -> bool:
        """True once the adaptive phase has lasted ``adapt_s`` (never with ``adapt_s`` 0)."""
        return self._done

    def observe(self, split: int, row: Mapping) -> None:
        """Learn from one measured inference (the head's row; ``t_unix`` its start)."""
        t0 = row.get("t_unix")
        if t0 is None:
            raise TracrError("adaptive: the inference row has no t_unix (its wall-clock "
                             "start); the head must record it")
        ok = not row.get("error") and row.get("e2e_ms") is not None
        now = float(t0) + (float(row["e2e_ms"]) / 1e3 if ok else 0.0)
        self._now = now if self._now is None else max(self._now, now)
        self._last_inference = row.get("inference")
        if self.phase == "interleaved":
            start = self.phases.setdefault("sweep", [float(t0), None])[0]
            self.phases.setdefault("adaptive", [float(t0), None])
            self.phases["sweep"][1] = self.phases["adaptive"][1] = now
            self._done = now - start >= self.p["sweep_s"] + self.p["adapt_s"]
            if self._was_sweep:
                i = int(row.get("inference", -1))
                if self.sweep_ids and self.sweep_ids[-1][1] == i - 1:
                    self.sweep_ids[-1][1] = i
                else:
                    self.sweep_ids.append([i, i])
                return
        elif self.phase == "sweep":
            start = self.phases.setdefault("sweep", [float(t0), None])[0]
            if now - start >= self.p["sweep_s"]:
                self.phases["sweep"][1] = now
                self.phase = "adaptive"
                self._note("phase", reason="hindsight sweep over: adapting")
            return
        if self.phase == "adaptive":
            self.phases.setdefault("adaptive", [float(t0), None])
            if self.p["adapt_s"] and now - self.phases["adaptive"][0] >= self.p["adapt_s"]:
                self._done = True
            self.phases["adaptive"][1] = now
        if not ok:
            self._note("error", split=split, reason=str(row.get("error"))[:200])
            return
        transfer = row.get("transfer_ms")
        if transfer is not None and split in self.fixed:
            self._seen.setdefault(split, deque(maxlen=5)).append(
                max(0.0, float(row["e2e_ms"]) - float(transfer)))
        nbytes = int(row.get("bytes_encoded") or 0)
        if (transfer is not None and self._calibrate_next and self._probe_rate
                and nbytes >= self.p["min_bytes"]):
            # the first inference after a probe: what its transfer took beyond its bytes
            # at the probed rate is overhead, not link
            # (unclamped: the rate moves between the probe and the inference either way,
            # and the median of many is clamped instead)
            self._overhead.append(float(transfer) - self.rtt_ms
                                  - nbytes / self._probe_rate * 1e3)
            self._calibrate_next = False
        used = transfer is not None and self.estimate.add(
            LinkSample(now, nbytes, float(transfer),
                       overhead_ms=self.rtt_ms + self.overhead_ms()))
        self._consider(now, "inference", e2e_ms=float(row["e2e_ms"]),
                       note="" if used else "too few bytes: no sample")

    def link_probe(self) -> int | None:
        """Bytes to probe the link with now (the head probes, then calls
        :meth:`observe_probe`), or None: only in the adaptive phase, when the newest
        informative sample is ``probe_every_s`` old (or there is none yet), or the last
        probe is ``calibrate_every_s`` old."""
        if self.phase == "sweep" or self._now is None:
            return None
        every, calib = self.p["probe_every_s"], self.p["calibrate_every_s"]
        if every and self.estimate.age_s(self._now) >= every:
            return int(self.p["probe_bytes"])
        if calib and (self._last_probe is None or self._now - self._last_probe >= calib):
            return int(self.p["probe_bytes"])
        return None

    def observe_probe(self, sample: LinkSample) -> None:
        """Learn from a probe of the link (``sample.ms``: the payload's round trip)."""
        self.probes["count"] += 1
        self.probes["ms"] += float(sample.ms)
        self._now = sample.t if self._now is None else max(self._now, sample.t)
        self._last_probe = sample.t
        if self.estimate.add(sample):
            self._probe_rate = sample.goodput_Bps(self.rtt_ms)
            self._calibrate_next = True
        self._consider(self._now, "probe")

    def _consider(self, now: float, source: str, e2e_ms: float | None = None,
                  note: str = "") -> None:
        """One estimate: switch when the hysteresis allows it, and log it."""
        bw = self.estimate.value_Bps()
        pred = self.predict(bw)
        best = min(pred, key=lambda k: (pred[k], k))
        cur = self.k
        gain = 1.0 - pred[best] / pred[cur] if pred.get(cur) else 0.0
        self._streak = self._streak + 1 if best != cur and gain > self.p["margin"] else 0
        dwell_ok = self._last_switch is None or now - self._last_switch >= self.p["dwell_s"]
        reason, event = note, source
        if self._streak >= self.p["confirm"] and dwell_ok:
            event = "switch"
            reason = (f"split {best} predicted {gain:.0%} faster than {cur} at "
                      f"{bw / 1e6:.3g} MB/s for {self._streak} estimates")
            self.switches.append({"t_unix": now, "inference": self._last_inference,
                                  "from": cur, "to": best, "estimate_Bps": bw,
                                  "predicted_from_ms": pred[cur], "predicted_to_ms": pred[best],
                                  "gain": gain, "reason": reason})
            self.k, self._last_switch, self._streak = best, now, 0
        elif self._streak:
            reason = (f"split {best} predicted {gain:.0%} faster ({self._streak}/"
                      f"{self.p['confirm']} estimates" + ("" if dwell_ok else ", dwelling")
                      + ")")
        self._note(event, split=self.k, estimate_Bps=bw, predicted_ms=pred[self.k],
                   e2e_ms=e2e_ms, t=now, reason=reason)

    def _note(self, event: str, split: int | None = None, estimate_Bps: float | None = None,
              predicted_ms: float | None = None, e2e_ms: float | None = None,
              t: float | None = None, reason: str = "") -> None:
        if len(self.log) < LOG_LIMIT:
            self.log.append({"t_unix": self._now if t is None else t,
                             "inference": self._last_inference, "event": event,
                             "split": self.k if split is None else split,
                             "estimate_Bps": estimate_Bps, "predicted_ms": predicted_ms,
                             "e2e_ms": e2e_ms, "reason": reason})

    def decision(self) -> dict:
        """The current choice, the candidates, the phases, every switch, the probes, the
        predictions at the current estimate, and the log (``adaptive.csv``)."""
        if self.k is None:
            return {"name": self.name, "params": self.params, "chosen": None}
        bw = self.estimate.value_Bps()
        return {"name": self.name, "params": self.params, "chosen": self.k,
                "criterion": "argmin predicted e2e at the online rate estimate, with "
                             "hysteresis", "candidates": self.candidates, "phase": self.phase,
                "phases": self.phases, "sweep_ids": self.sweep_ids or None,
                "estimate_Bps": bw, "rtt_ms": self.rtt_ms,
                "predicted": self.predict(bw), "chosen_ms": self.predict(bw)[self.k],
                "switches": self.switches, "probes": dict(self.probes),
                "overhead_ms": self.overhead_ms(), "overhead_samples": len(self._overhead),
                **self._decision, "log": self.log}
