"""The cyclic partitioner (the paper's sweep) and the fixed one."""

from __future__ import annotations

import random
import statistics
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.params import Param
from experiment_design.partitioners.base import (
    PartitionContext,
    Partitioner,
    register_partitioner,
)
from experiment_design.runtime.fidelity import transport_label
from experiment_design.stats import bootstrap_medians, interval, separated

#: the orders of the walk
ORDERS = ("interleaved", "sequential", "shuffled")


@register_partitioner("cyclic")
class CyclicPartitioner(Partitioner):
    """Walk every allowed split point, each ``repeats`` times, then wrap around.

    Params: ``repeats`` (int, default 1); ``splits``: ``"all"`` (default) or a
    list of split indices restricting the allowed set (invalid ones are an
    error); ``order``: ``"interleaved"`` (default: round-robin, 1, 2, ..., n, 1, 2, ...,
    so slow drift of the hosts is spread over every split instead of loading it on some),
    ``"sequential"`` (each split ``repeats`` times in a row, the paper's walk) or
    ``"shuffled"`` (each round in a random order drawn from ``seed``, default 0; the same
    order every pass); ``refine`` (int, default 0) and ``contenders`` (int, default 8): after
    the walk, the ``contenders`` splits with the lowest measured median end-to-end
    latency get ``refine`` more inferences each, in turn (k1, k2, ..., k1, k2, ...).
    A sweep's best split is the minimum of many noisy medians, so it is biased low
    and unstable when several splits are close; measuring the close ones more
    is where extra repeats pay (racing). One sweep is
    ``len(allowed) * repeats + min(contenders, len(allowed)) * refine`` inferences.

    ``race`` (``{confidence: 0.95, budget: N, min_samples: 5, resamples: 1000}``) replaces
    ``refine``'s fixed count with racing on evidence: after the walk the ``contenders`` are
    measured round-robin, and after each round a contender is dropped when a percentile
    bootstrap (``resamples`` draws, seeded by ``seed``) puts the whole ``confidence``
    interval of its median minus the best contender's median above zero, once both have
    ``min_samples`` measurements; it stops when one is left (``"separated"``) or after
    ``budget`` extra inferences (``"budget"``), whichever comes first, and
    :meth:`finished` says so (the infer-dataset task stops there). A raced sweep is one
    pass; :meth:`sweep_length` is then an upper bound, walk + ``budget``. With
    ``precision`` (e.g. ``0.015``), a race whose winner is separated goes on measuring the
    winner alone, five inferences a round, until the ``confidence`` interval of its median
    is within ``precision`` of the median on either side or the budget is spent: a winner
    separated after five inferences otherwise keeps a median uncertain by 5-20%, more than
    the difference between two runs that a reader compares. The decision gives the
    winner's interval half-width (``best_halfwidth_pct``) either way, and with
    ``precision`` whether it was reached (``precise``).

    Resuming (``tracr experiment run NAME --resume RUN`` sets these): ``done``
    (``{split: n}``) counts the measurements an earlier, incomplete run already
    made; the first ``n`` visits of split ``k`` are skipped, so each split still
    ends with its planned count. ``passes`` (default 1) is how many sweeps the
    task runs; :meth:`sweep_length` is then what is left of those passes.

    ``transports`` (a list of transport dicts, each like the manifest's ``transport``
    section, plus an optional ``splits`` list): walk every (split, transport) pair instead,
    ``repeats`` each, listed split-major and visited in ``order``; after each
    :meth:`next_split`, :attr:`transport` is the chosen pair's ``CodecConfig`` (None
    without ``transports``), which the head sends the crossing tensors with. A transport with ``splits`` is used at those splits only;
    ``jpeg`` and ``webp`` (image codecs for the model's input) default to split 0. Not
    combined with ``refine``, ``race`` or a resume; ``order`` applies to the pairs. ``fidelity_floor`` (top-1 agreement, default
    0.99) and ``bandwidths`` (rates such as ``4MB/s``) are read by the summary's
    rate-fidelity answer, not by the walk.
    """

    PARAMS = {
        "repeats": Param("int", default=1, min=1, doc="inferences per split (pair) per pass"),
        "refine": Param("int", default=0, min=0, doc="rounds that re-measure the fastest"),
        "contenders": Param("int", default=8, min=1, doc="how many splits refine or race"),
        "passes": Param("int", default=1, min=1, doc="walks over every split"),
        "order": Param("str", default="interleaved", choices=ORDERS),
        "seed": Param("int", default=0, min=0, doc="the shuffled order's seed"),
        "race": Param("map", nullable=True, doc="{confidence, budget, precision}"),
        "transports": Param("list", nullable=True, doc="walk (split, transport) pairs"),
    }

    def __init__(self, repeats: int = 1, splits: Any = "all", refine: int = 0,
                 contenders: int = 8, done: dict | None = None, passes: int = 1,
                 transports: list | None = None, order: str = "interleaved",
                 race: dict | None = None, seed: int = 0, **params: Any) -> None:
        super().__init__(repeats=repeats, splits=splits, refine=refine, contenders=contenders,
                         order=order, **params)
        if race is not None:
            self.params["race"] = race
        if seed:
            self.params["seed"] = seed
        if order not in ORDERS:
            raise TracrError(f"cyclic: unknown order {order!r}. The valid options are "
                             f"{list(ORDERS)}")
        if transports is not None:
            self.params["transports"] = transports
        if done:
            self.params["done"] = done
        if passes != 1:
            self.params["passes"] = passes
        if int(repeats) < 1:
            raise TracrError(f"cyclic: repeats must be >= 1, got {repeats}")
        if int(refine) < 0 or int(contenders) < 1:
            raise TracrError(f"cyclic: refine must be >= 0 and contenders >= 1, got "
                             f"refine={refine}, contenders={contenders}")
        self.done = _counts(done)
        if int(passes) < 1:
            raise TracrError(f"cyclic: passes must be >= 1, got {passes}")
        if self.done and int(refine):
            raise TracrError("cyclic: resuming a sweep with refine rounds is not supported",
                             hint="resume with partitioner.params.refine=0, or run it again")
        self.transports = parse_transports(transports)
        if self.transports and (int(refine) or self.done):
            raise TracrError("cyclic: transports cannot be combined with refine rounds or a "
                             "resume", hint="set partitioner.params.refine=0 and run it again")
        self.race = _race(race)
        if self.race and (int(refine) or self.done or self.transports or int(passes) != 1):
            raise TracrError("cyclic: race cannot be combined with refine rounds, transports, "
                             "a resume or several passes",
                             hint="race replaces refine: set partitioner.params.refine=0")
        self.order = order
        self.seed = int(seed)
        #: the CodecConfig of the last decision (None: the manifest's transport)
        self.transport: Any = None
        #: how many times the last decision's (split, transport) pair came before: the
        #: infer-dataset task infers input ``item`` (cycled), so every split sees the same
        #: inputs in any order
        self.item = 0
        self._seen: dict[tuple[int, int | None], int] = {}
        self.slots: list[tuple[int, int | None]] = []
        self.repeats = int(repeats)
        self.refine = int(refine)
        self.n_contenders = int(contenders)
        self.passes = int(passes)
        self.splits = splits
        self.allowed: list[int] = []
        self.contenders: list[int] = []
        #: the scored partitioners' choices a race also measures (see _pick_contenders)
        self.scored: list[int] = []
        self.e2e: dict[int, list[float]] = {}
        self._n = 0
        self._pos = 0
        self._skip: dict[int, int] = {}
        self._visits: list[int] = []
        self._queue: list[int] = []
        self._raced = 0
        self._rounds = 0
        #: why the race stopped: None while it runs, "separated" or "budget"
        self.stopped: str | None = None

    def setup(self, ctx: PartitionContext) -> None:
        """Resolve the allowed split set against the model's valid splits."""
        super().setup(ctx)
        valid = list(ctx.valid_splits)
        if self.splits in (None, "all"):
            self.allowed = valid
        else:
            wanted = [int(s) for s in (self.splits if isinstance(self.splits, list) else [self.splits])]
            bad = [s for s in wanted if s not in valid]
            if bad:
                raise TracrError(
                    f"cyclic: split(s) {bad} are not valid for this model.",
                    hint=f"valid splits are {valid}",
                )
            self.allowed = wanted
        if self.transports:
            self.slots = [(k, i) for k in self.allowed
                          for i, (_, only, _) in enumerate(self.transports)
                          if only is None or k in only]
        else:
            self.slots = [(k, None) for k in self.allowed]
        self.transport = None
        self.contenders, self.e2e, self._n, self._pos = [], {}, 0, 0
        self._skip = dict(self.done)
        self._visits = _visits(len(self.slots), self.repeats, self.order, self.seed)
        self._queue, self._raced, self._rounds, self.stopped = [], 0, 0, None
        self._seen, self.item = {}, 0
        self.scored = sorted({int(k) for k in (ctx.scored_choices or [])})

    def _walk(self) -> int:
        return len(self.slots) * self.repeats

    def _n_refine(self) -> int:
        if self.race:
            return self.race["budget"]
        return min(self.n_contenders, len(self.allowed)) * self.refine

    def observe(self, split: int, row: dict) -> None:
        """Keep each split's end-to-end latencies (failed inferences are not kept)."""
        if not row.get("error") and row.get("e2e_ms") is not None:
            self.e2e.setdefault(int(split), []).append(float(row["e2e_ms"]))

    def _pick_contenders(self) -> list[int]:
        """The allowed splits with the lowest median e2e so far (unmeasured ones last); a
        race adds the splits the scored partitioners chose (``ctx.scored_choices``): with
        the walk's few samples of a split (three, where one sample's CPU time moves 2x on
        a paced edge) a choice could be left out of the race on an unlucky walk and scored
        as if it had lost it (MobileNetV2's split 32, which does less than split 33 and
        sends the same bytes, read 61.8 ms from three samples against 33's 45.1 from 81)."""
        def key(k: int) -> tuple[float, int]:
            v = self.e2e.get(k)
            return (statistics.median(v) if v else float("inf"), k)

        top = sorted(self.allowed, key=key)[: min(self.n_contenders, len(self.allowed))]
        if not self.race:
            return top
        extra = [k for k in self.scored if k in self.allowed and k not in top]
        return sorted(top + extra, key=key)

    def next_split(self) -> int:
        """The walk (each allowed split ``repeats`` times), then the refine rounds over the
        contenders; wraps around after a whole sweep. Visits counted in ``done`` are skipped.
        With ``race``, the race's rounds follow the walk; once it is over, the best contender."""
        self._n += 1
        if self.race and self._pos >= self._walk():
            if not self._queue:
                self._race_round()
            k = self._queue.pop(0) if self._queue else self.contenders[0]
            self._raced += 1 if self.stopped is None else 0
            return self._count(k, None)
        while True:
            k = self._at(self._pos)
            self._pos += 1
            if self._skip.get(k, 0) > 0:
                self._skip[k] -= 1
                continue
            return k

    def _at(self, pos: int) -> int:
        """The split at position ``pos`` of the (endless) cyclic schedule; sets
        :attr:`transport` to that pair's."""
        i = pos % (self._walk() + self._n_refine())
        if i < self._walk():
            k, t = self.slots[self._visits[i]]
            self.transport = None if t is None else self.transports[t][2]
            return self._count(k, t)
        if i == self._walk():
            self.contenders = self._pick_contenders()
        j = i - self._walk()
        return self._count(self.contenders[j % len(self.contenders)], None)

    def _count(self, k: int, t: int | None) -> int:
        """``k``, with :attr:`item` set to the visits of pair (k, t) before this one."""
        self.item = self._seen.get((k, t), 0)
        self._seen[(k, t)] = self.item + 1
        return k

    def finished(self) -> bool:
        """True once the race is over (never without ``race``): the task stops there."""
        if not self.race or self._pos < self._walk():
            return False
        if not self._queue:
            self._race_round()
        return self.stopped is not None

    def _race_round(self) -> None:
        """At a round boundary: pick the contenders (first time) or drop the separated
        ones, then queue the next round, or stop the race."""
        if self.stopped is not None:
            return
        if self._rounds == 0:
            self.contenders = self._pick_contenders()
        else:
            self.contenders = self._survivors()
        if len(self.contenders) <= 1:
            left = self.race["budget"] - self._raced
            if self.contenders and left > 0 and not self._precise(self.contenders[0]):
                self._rounds += 1
                self._queue = [self.contenders[0]] * min(PRECISION_ROUND, left)
                return
            self.stopped = "separated"
        elif self._raced >= self.race["budget"]:
            self.stopped = "budget"
        else:
            self._rounds += 1
            self._queue = self.contenders[: self.race["budget"] - self._raced]

    def _survivors(self) -> list[int]:
        """The contenders, best median first, less those separated from the best."""
        def med(k: int) -> float:
            v = self.e2e.get(k)
            return statistics.median(v) if v else float("inf")

        ranked = sorted(self.contenders, key=lambda k: (med(k), k))
        best = ranked[0]
        return [best] + [k for k in ranked[1:] if not self._separated(k, best)]

    def _halfwidth(self, k: int) -> float | None:
        """Half the width of the ``confidence`` bootstrap interval of split ``k``'s median,
        as a share of that median (None before ``min_samples`` measurements)."""
        v = self.e2e.get(k, [])
        if len(v) < self.race["min_samples"]:
            return None
        boot = bootstrap_medians(v, [self.seed, k, len(v), 2], self.race["resamples"])
        lo, hi = interval(boot, self.race["confidence"])
        med = statistics.median(v)
        return (hi - lo) / 2 / med if med > 0 else None

    def _precise(self, k: int) -> bool:
        """Whether split ``k``'s median is known to ``precision`` (always, without it)."""
        if self.race.get("precision") is None:
            return True
        h = self._halfwidth(k)
        return h is not None and h <= self.race["precision"]

    def _separated(self, k: int, best: int) -> bool:
        """Whether the percentile-bootstrap interval (at ``confidence``) of median(k) -
        median(best) lies entirely above zero; False before ``min_samples`` each. Seeded by
        the pair and their counts, so the same measurements always give the same answer."""
        a, b = self.e2e.get(k, []), self.e2e.get(best, [])
        if min(len(a), len(b)) < self.race["min_samples"]:
            return False
        return separated(a, b, [self.seed, k, best, len(a), len(b)],
                         self.race["confidence"], self.race["resamples"])

    def sweep_length(self) -> int:
        """len(allowed splits) x repeats, plus the refine rounds, times ``passes``; less the
        visits a resumed run's ``done`` counts skip. With ``race``: walk + ``budget``, an
        upper bound (:meth:`finished` says when the race ended earlier)."""
        planned = self.repeats * self.passes
        skipped = sum(min(n, planned) for k, n in self.done.items() if k in self.allowed)
        return (self._walk() + self._n_refine()) * self.passes - skipped

    def decision(self) -> dict:
        """The allowed set, repeats, the refined contenders and position in the cycle."""
        out = {
            "name": self.name,
            "allowed": self.allowed,
            "repeats": self.repeats,
            "sweep_length": self.sweep_length(),
            "issued": self._n,
            "order": self.order,
        }
        if self.done:
            out.update(done={str(k): n for k, n in sorted(self.done.items())}, passes=self.passes)
        if self.refine:
            out.update(refine=self.refine, contenders=self.contenders)
        if self.race:
            h = self._halfwidth(self.contenders[0]) if self.contenders else None
            out.update(race={**self.race, "stopped": self.stopped, "contenders": self.contenders,
                             "rounds": self._rounds, "inferences": self._raced,
                             "scored_choices": self.scored,
                             "best_halfwidth_pct": None if h is None else round(100 * h, 2),
                             "precise": (None if self.race["precision"] is None
                                         else h is not None and h <= self.race["precision"])},
                       inferences=self._n)
        if self.transports:
            out.update(transports=[transport_label(cfg) for _, _, cfg in self.transports],
                       pairs=len(self.slots))
        return out


#: the race's settings and their defaults
_RACE = {"confidence": 0.95, "budget": None, "min_samples": 5, "resamples": 1000,
         "precision": None}

#: inferences of a separated winner per round while its median is not yet precise
PRECISION_ROUND = 5


def _visits(n_slots: int, repeats: int, order: str, seed: int) -> list[int]:
    """The walk as slot indices: every slot ``repeats`` times, in ``order``."""
    if order == "sequential":
        return [i for i in range(n_slots) for _ in range(repeats)]
    rng = random.Random(seed)
    out: list[int] = []
    for _ in range(repeats):
        round_ = list(range(n_slots))
        if order == "shuffled":
            rng.shuffle(round_)
        out.extend(round_)
    return out


def _race(race: Any) -> dict | None:
    """The ``race`` param with its defaults, checked (None: no race)."""
    if race in (None, False, {}):
        return None
    if not isinstance(race, dict):
        raise TracrError(f"cyclic: race must be a mapping like {{confidence: 0.95, budget: 40}}, "
                         f"not {race!r}")
    unknown = sorted(set(race) - set(_RACE))
    if unknown:
        raise TracrError(f"cyclic: unknown race key(s) {unknown}. The valid options are "
                         f"{list(_RACE)}")
    out = {**_RACE, **race}
    try:
        conf, budget = float(out["confidence"]), int(out["budget"])
        n_min, draws = int(out["min_samples"]), int(out["resamples"])
    except (TypeError, ValueError):
        raise TracrError(f"cyclic: race needs a numeric confidence and an integer budget, "
                         f"got {race!r}") from None
    precision = out["precision"]
    try:
        precision = None if precision is None else float(precision)
    except (TypeError, ValueError):
        precision = -1.0
    if not 0.5 <= conf < 1.0 or budget < 1 or n_min < 2 or draws < 100 or (
            precision is not None and not 0.0 < precision < 1.0):
        raise TracrError(f"cyclic: race needs 0.5 <= confidence < 1, budget >= 1, "
                         f"min_samples >= 2, resamples >= 100 and 0 < precision < 1 "
                         f"(a share of the median, e.g. 0.015), got {race!r}")
    return {"confidence": conf, "budget": budget, "min_samples": n_min, "resamples": draws,
            "precision": precision}


#: lossy reductions that apply to an image model's input only (split 0)
_INPUT_ONLY = ("jpeg", "webp")


def parse_transports(items: Any) -> list[tuple[dict, list[int] | None, Any]]:
    """``(transport dict, splits or None, CodecConfig)`` per item of the ``transports``
    param, checked (each dict as the manifest's ``transport`` section takes it)."""
    if items in (None, []):
        return []
    if not isinstance(items, list):
        raise TracrError(f"cyclic: transports must be a list of transport settings, not {items!r}")
    from experiment_design.transport import CodecConfig  # loads torch: not at validate

    out = []
    for j, item in enumerate(items):
        if not isinstance(item, dict):
            raise TracrError(f"cyclic: transports[{j}] must be a mapping, not {item!r}")
        d = dict(item)
        only = d.pop("splits", None)
        try:
            cfg = CodecConfig.from_dict(d)
        except TracrError as exc:
            raise TracrError(f"cyclic: transports[{j}]: {exc}", hint=exc.hint) from None
        if only is None and getattr(cfg, "lossy", "none") in _INPUT_ONLY:
            only = [0]
        if only is not None:
            if not isinstance(only, list) or not all(
                    isinstance(k, int) and not isinstance(k, bool) for k in only):
                raise TracrError(f"cyclic: transports[{j}].splits must be a list of split "
                                 f"indices, not {only!r}")
        out.append((d, only, cfg))
    return out


def _counts(done: Any) -> dict[int, int]:
    """``{split: count}`` with integer keys (JSON turns them into strings); checked."""
    if done in (None, {}):
        return {}
    if not isinstance(done, dict):
        raise TracrError(f"cyclic: done must be a mapping of split to count, not {done!r}")
    try:
        out = {int(k): int(v) for k, v in done.items()}
    except (TypeError, ValueError):
        raise TracrError(f"cyclic: done must map split indices to counts, not {done!r}") from None
    if any(v < 0 for v in out.values()):
        raise TracrError(f"cyclic: done counts must be >= 0, got {done!r}")
    return out


@register_partitioner("fixed")
class FixedPartitioner(Partitioner):
    """Always the same split (param ``split``; ``-1`` means the last layer)."""

    def __init__(self, split: int = 0, **params: Any) -> None:
        super().__init__(split=split, **params)
        self.split = int(split)

    def setup(self, ctx: PartitionContext) -> None:
        """Check the split is valid for this model."""
        super().setup(ctx)
        n = len(ctx.points) - 1 if ctx.points else max(ctx.valid_splits)
        if self.split < 0:
            self.split = n + 1 + self.split
        if self.split not in ctx.valid_splits:
            raise TracrError(
                f"fixed: split {self.split} is not valid for this model.",
                hint=f"valid splits are {ctx.valid_splits}",
            )

    def next_split(self) -> int:
        """The configured split."""
        return self.split

    def decision(self) -> dict:
        """The configured split."""
        return {"name": self.name, "chosen": self.split}
