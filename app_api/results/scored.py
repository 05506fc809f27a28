"""The partitioners a manifest scores (``evaluate.partitioners``): built from their entries.

An entry is a registry name (``"neurosurgeon"``) or ``{name, params, label}`` (the same
partitioner with other params under its own label). Before the sweep the runner asks
them what they need of it: the splits the split-only ones already choose from the
start-up measurements (:func:`split_choices`, raced beside the sweep's own contenders)
and the fidelity probe the pair-choosing ones need (:func:`fidelity_request`). After
it, :mod:`app_api.results.scoring` scores them against what was measured.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.partitioners import (
    PartitionContext,
    create_partitioner,
    get_partitioner,
)

log = logging.getLogger(__name__)


def entry_spec(entry: str | Mapping) -> tuple[str, str, dict]:
    """(label, registry name, params) from ``"name"`` or ``{name, params, label}``."""
    if isinstance(entry, str):
        return entry, entry, {}
    name = entry["name"]
    params = dict(entry.get("params") or {})
    label = entry.get("label") or name
    return str(label), str(name), params


def needs_fidelity(name: str) -> bool:
    """Whether partitioner ``name`` chooses the transport too (its ``needs`` has
    ``fidelity``): it is scored against the measured (split, transport) pairs."""
    return "fidelity" in get_partitioner(name).needs


def pair_params(params: Mapping, sweep: Mapping | None) -> dict:
    """A scored split-codec's params, with the sweep's ``transports`` and ``splits`` where
    it names none: it then chooses among the pairs the sweep measured."""
    out = dict(params)
    for key in ("transports", "splits"):
        if key not in out and (sweep or {}).get(key) is not None:
            out[key] = (sweep or {})[key]
    return out


def create_scored(name: str, params: Mapping, sweep: Mapping | None) -> Any:
    """A scored partitioner, a pair-choosing one given the sweep's transports and splits
    where its params name none (:func:`pair_params`)."""
    if needs_fidelity(name):
        params = pair_params(params, sweep)
    return create_partitioner(name, **params)


def split_choices(names: Iterable[str | Mapping], ctx: Mapping,
                  sweep: Mapping | None = None) -> list[int]:
    """The splits the split-only partitioners among ``names`` choose from the start-up
    measurements ``ctx`` (``PartitionContext`` fields), before the sweep: a racing sweep
    races them beside its own contenders (``PartitionContext.scored_choices``), so each is
    scored on a measured median, not on the walk's few samples. A partitioner that cannot
    decide yet (one that needs the sweep's medians, or the fidelity probe) is left out."""
    base = PartitionContext.from_dict(dict(ctx))
    out = set()
    for entry in names:
        _, name, params = entry_spec(entry)
        if needs_fidelity(name):
            continue
        try:
            part = create_scored(name, params, sweep)
            if "measured" in part.needs:
                continue
            part.setup(dataclasses.replace(base))
            chosen = part.decision().get("chosen")
        except TracrError as e:
            log.info("partitioner %s cannot choose before the sweep: %s", name, e)
            continue
        if chosen is not None:
            out.add(int(chosen))
    return sorted(out)


def fidelity_request(names: Iterable[str | Mapping], sweep: Mapping | None) -> dict | None:
    """The head's start-up fidelity probe that the scored partitioners need (the union of
    each one's ``probe_request()``), or None when none needs one."""
    out: dict | None = None
    for entry in names:
        _, name, params = entry_spec(entry)
        if not needs_fidelity(name):
            continue
        req = create_scored(name, params, sweep).probe_request()
        if out is None:
            out = req
            continue
        seen = {json.dumps(t, sort_keys=True) for t in out["transports"]}
        out["transports"] += [t for t in req["transports"]
                              if json.dumps(t, sort_keys=True) not in seen]
        if "all" in (out["splits"], req["splits"]):
            out["splits"] = "all"
        else:
            out["splits"] = sorted(set(out["splits"]) | set(req["splits"]))
        out["items"] = max(out["items"], req["items"])
        out["max_splits"] = None if not (out["max_splits"] and req["max_splits"]) else max(
            out["max_splits"], req["max_splits"])
    return out
