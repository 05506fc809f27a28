"""Pareto fronts over a pipeline sweep's configurations (rows of ``configs.csv``).

A configuration is on the front of its group when no other configuration of the group is
at least as good in every objective and strictly better in one. Groups are the
``(bandwidth, batch)`` pairs: a point measured at another link rate or batch size answers
another question, so it neither dominates nor is dominated across groups. The mode stays
inside a group: a latency-mode and a throughput-mode run of the same cuts are two points.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from app_api.units import parse_rate
from experiment_design.errors import TracrError, UnknownNameError

#: objective -> (configs.csv column, +1 to minimize / -1 to maximize, what it means)
OBJECTIVES: dict[str, tuple[str, int, str]] = {
    "latency": ("latency_ms_p50", 1, "median latency (ms), lower is better"),
    "throughput": ("throughput_per_s", -1, "inferences per second, higher is better"),
    "bytes": ("bytes_per_inference", 1, "encoded bytes over every link per inference, "
                                        "lower is better"),
}
DEFAULT_OBJECTIVES = ("latency", "throughput")


@dataclass
class ParetoGroup:
    """The points of one ``(bandwidth, batch)`` group and which of them form its front.

    ``points`` are the rows with every objective measured, best first in the first objective
    (ties broken by the next objectives, then by cuts, mode and chain); ``on_front`` runs
    parallel to them. ``excluded`` holds ``(row, reason)`` for rows that cannot be compared:
    every inference failed, or an objective has no value.
    """

    bandwidth: str | None
    batch: int | None
    points: list[dict] = field(default_factory=list)
    on_front: list[bool] = field(default_factory=list)
    excluded: list[tuple[dict, str]] = field(default_factory=list)

    @property
    def front(self) -> list[dict]:
        """The non-dominated points, in the order of ``points``."""
        return [p for p, f in zip(self.points, self.on_front, strict=True) if f]

    @property
    def label(self) -> str:
        """``4MB/s, batch 1`` (``unshaped`` when the link was not shaped)."""
        bw = self.bandwidth or "unshaped"
        return bw if self.batch is None else f"{bw}, batch {self.batch}"


def parse_objectives(spec: str | Sequence[str]) -> tuple[str, ...]:
    """``"latency,throughput"`` (or a sequence of names) as a tuple of known objectives, in
    order, duplicates dropped. An unknown or empty list is a TracrError (exit code 2)."""
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for raw in names:
        name = raw.strip().lower()
        if not name:
            continue
        if name not in OBJECTIVES:
            raise UnknownNameError("objective", raw.strip(), OBJECTIVES,
                                   hint="e.g. --objectives latency,throughput,bytes")
        if name not in out:
            out.append(name)
    if not out:
        raise TracrError("no objectives given", hint="e.g. --objectives latency,throughput")
    return tuple(out)


def pareto_front(rows: Iterable[dict], objectives: str | Sequence[str] = DEFAULT_OBJECTIVES
                 ) -> list[ParetoGroup]:
    """One :class:`ParetoGroup` per ``(bandwidth, batch)`` of ``rows`` (typed configs.csv rows,
    as :func:`~app_api.results.store.read_configs` returns them), each with its front.

    Groups come slowest link first (unshaped last), then by batch. Ties are kept: two points
    with equal values dominate neither each other nor anything the other does not.
    """
    objs = parse_objectives(objectives)
    groups: dict[tuple[str | None, int | None], ParetoGroup] = {}
    for row in rows:
        key = (row.get("bandwidth") or None, row.get("batch"))
        group = groups.setdefault(key, ParetoGroup(*key))
        reason = _exclusion(row, objs)
        if reason:
            group.excluded.append((row, reason))
        else:
            group.points.append(row)
    out = [groups[k] for k in sorted(groups, key=_group_order)]
    for group in out:
        group.points.sort(key=lambda r: (_vector(r, objs), _identity(r)))
        group.on_front = _non_dominated([_vector(r, objs) for r in group.points])
    return out


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether objective vector ``a`` dominates ``b`` (both to minimize): no worse anywhere,
    strictly better somewhere."""
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(
        x < y for x, y in zip(a, b, strict=True))


def _vector(row: dict, objs: Sequence[str]) -> tuple[float, ...]:
    """The row's objective values, oriented so that lower is better in every one."""
    return tuple(OBJECTIVES[o][1] * float(row[OBJECTIVES[o][0]]) for o in objs)


def _non_dominated(vectors: list[tuple[float, ...]]) -> list[bool]:
    """Flags of the non-dominated vectors of a lexicographically sorted list.

    A dominator sorts strictly before what it dominates, and domination is transitive, so
    comparing each vector with the front found so far is enough: O(n * front size).
    """
    front: list[tuple[float, ...]] = []
    flags = []
    for v in vectors:
        keep = not any(dominates(f, v) for f in front)
        if keep:
            front.append(v)
        flags.append(keep)
    return flags


def _exclusion(row: dict, objs: Sequence[str]) -> str | None:
    """Why ``row`` cannot be placed (None when it can)."""
    n, errors = row.get("inferences"), row.get("errors") or 0
    if n == 0:
        return "no inferences"
    if errors and n is not None and errors >= n:
        return f"all {n} inferences failed"
    missing = [OBJECTIVES[o][0] for o in objs if not _finite(row.get(OBJECTIVES[o][0]))]
    if missing:
        return f"no value for {', '.join(missing)}"
    return None


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _identity(row: dict) -> tuple:
    """A total order on configurations with equal objective values: cuts, mode, chain."""
    return (list(row.get("cuts") or []), str(row.get("mode") or ""),
            list(row.get("chain") or []), str(row.get("config") or ""))


def _group_order(key: tuple[str | None, int | None]) -> tuple:
    """Slowest link first; labels that are not rates after the rates; unshaped last."""
    bandwidth, batch = key
    if bandwidth is None:
        rank: tuple = (2, 0.0, "")
    else:
        try:
            rank = (0, parse_rate(bandwidth), bandwidth)
        except TracrError:
            rank = (1, 0.0, bandwidth)
    return (*rank, batch is None, batch or 0)
