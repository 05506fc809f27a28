"""Observer-side scoring of partitioners against a measured sweep.

After a cyclic sweep the observer knows the measured median end-to-end time
of every split. Each partitioner named in the manifest's
``evaluate.partitioners`` is set up on the same start-up measurements (the
profiles and the probed link) and scored: did it pick the measured best split
(``regret = chosen_ms / best_ms``, 1.0 is perfect), and how well does its
predicted latency rank the splits (Spearman's rank correlation between its
predicted and the measured totals across split points)?
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from app_api.fsutil import atomic_write

log = logging.getLogger(__name__)


def _ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties get the average of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        avg = (i + j) / 2 + 1
        for t in range(i, j + 1):
            ranks[order[t]] = avg
        i = j + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rho (Pearson correlation of average ranks); None if undefined.

    Undefined with fewer than two pairs or when either side is constant.
    """
    if len(a) != len(b):
        raise ValueError("spearman needs two sequences of the same length")
    if len(a) < 2:
        return None
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    if va == 0 or vb == 0:
        return None
    return cov / math.sqrt(va * vb)


def _spec(entry: str | Mapping) -> tuple[str, str, dict]:
    """(label, registry name, params) from ``"name"`` or ``{name, params, label}``."""
    if isinstance(entry, str):
        return entry, entry, {}
    name = entry["name"]
    params = dict(entry.get("params") or {})
    label = entry.get("label") or name
    return str(label), str(name), params


def _num(x: Any) -> float | None:
    return None if x is None else float(x)


def evaluate_partitioners(
    names: Iterable[str | Mapping],
    ctx: Any,
    measured_medians: Mapping[int, float],
) -> dict:
    """Score partitioners against measured medians.

    ``names``: partitioner names, or ``{name, params, label}`` dicts (the same
    partitioner with different params, e.g. ``criterion: ineq4``, under its
    own label). ``ctx``: the run's ``PartitionContext`` (profiles, network);
    its ``measured`` is replaced by ``measured_medians`` (``{split: ms}``).

    Returns ``{label: {chosen, chosen_ms, best, best_ms, regret, spearman,
    predicted, criterion, decision}}``; a partitioner that cannot decide
    (e.g. no profile) gets ``{"error": message}`` instead of failing the
    whole summary.
    """
    from experiment_design.errors import TracrError
    from experiment_design.partitioners import create_partitioner

    measured = {
        int(k): float(v)
        for k, v in measured_medians.items()
        if v is not None and math.isfinite(float(v))
    }
    best = min(measured, key=lambda k: (measured[k], k)) if measured else None
    best_ms = measured.get(best) if best is not None else None
    # a sweep over some split points scores the partitioners among those points only, so
    # every choice has a measured latency (and a regret)
    candidates = [k for k in ctx.valid_splits if k in measured] or list(ctx.valid_splits)
    run_ctx = dataclasses.replace(ctx, measured=dict(measured), valid_splits=candidates)

    out: dict[str, dict] = {}
    for entry in names:
        label, name, params = _spec(entry)
        try:
            part = create_partitioner(name, **params)
            part.setup(run_ctx)
            dec = json.loads(json.dumps(part.decision(), default=str))
        except TracrError as e:
            log.warning("partitioner %s could not decide: %s", label, e)
            out[label] = {"name": name, "error": str(e), "hint": e.hint}
            continue
        chosen = dec.get("chosen")
        chosen_ms = measured.get(int(chosen)) if chosen is not None else None
        predicted = {
            int(k): float(v) for k, v in (dec.get("predicted") or {}).items() if v is not None
        }
        common = sorted(set(predicted) & set(measured))
        rho = (
            spearman([predicted[k] for k in common], [measured[k] for k in common])
            if predicted
            else None
        )
        out[label] = {
            "name": name,
            "chosen": chosen,
            "chosen_ms": _num(chosen_ms),
            "best": best,
            "best_ms": _num(best_ms),
            "regret": (chosen_ms / best_ms) if chosen_ms is not None and best_ms else None,
            "spearman": rho,
            "spearman_n": len(common) if predicted else 0,
            "predicted": predicted or None,
            "predicted_chosen_ms": _num(predicted.get(chosen)) if chosen is not None else None,
            "criterion": dec.get("criterion"),
            "notes": dec.get("notes", []),
            "decision": dec,
        }
        if chosen is not None and chosen_ms is None:
            out[label]["notes"] = [
                *out[label]["notes"],
                f"chosen split {chosen} was not measured in the sweep",
            ]
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
    """:func:`split_half_regret` of a run's inference rows (failed ones left out)."""
    by_split: dict[int, list[float]] = {}
    for r in rows:
        if not r.get("error") and r.get("e2e_ms") is not None:
            by_split.setdefault(int(r["split"]), []).append(float(r["e2e_ms"]))
    return split_half_regret(by_split)


def summary_view(evaluation: Mapping[str, Mapping]) -> dict:
    """The compact per-partitioner block for ``summary.json["partitioners"]``."""
    keys = ("chosen", "chosen_ms", "best", "best_ms", "regret", "spearman", "criterion", "error")
    return {label: {k: ev[k] for k in keys if k in ev} for label, ev in evaluation.items()}


def bandwidth_what_if(
    names: Iterable[str | Mapping], ctx: Any, bandwidths_Bps: Sequence[float]
) -> dict:
    """How each partitioner's choice moves with link bandwidth, from the same profiles.

    Predictions only (no new measurement): the context's network is replaced
    by each bandwidth in turn, keeping the probed rtt. Returns
    ``{bandwidth: {label: {chosen, predicted_chosen_ms}}}``.
    """
    from experiment_design.errors import TracrError
    from experiment_design.partitioners import create_partitioner

    rtt = float((ctx.network or {}).get("rtt_ms") or 0.0)
    out: dict[float, dict] = {}
    for bw in bandwidths_Bps:
        c = dataclasses.replace(
            ctx, network={"bandwidth_Bps": float(bw), "rtt_ms": rtt, "source": "what-if"}
        )
        row = {}
        for entry in names:
            label, name, params = _spec(entry)
            if name == "measured":
                continue  # needs a real sweep at that bandwidth
            try:
                part = create_partitioner(name, **params)
                part.setup(c)
            except TracrError as e:
                row[label] = {"error": str(e)}
                continue
            dec = part.decision()
            row[label] = {"chosen": dec["chosen"], "predicted_chosen_ms": dec.get("chosen_ms")}
        out[float(bw)] = row
    return out


def write_partitioners_json(
    run_dir: str | Path,
    ctx: Any,
    evaluation: Mapping | None = None,
    decisions: Mapping | None = None,
    what_if: Mapping | None = None,
) -> Path:
    """Write ``partitioners.json`` (inputs + every decision) into the run directory."""
    from experiment_design.partitioners.predicted import summarize_inputs

    doc = {
        "inputs": {
            **summarize_inputs(ctx),
            "edge_profile": ctx.edge_profile,
            "cloud_profile": ctx.cloud_profile,
            "points": [
                {k: p.get(k) for k in ("index", "layer", "crossing_bytes", "valid")}
                for p in ctx.points
            ],
        },
        "decisions": dict(decisions or {}),
        "evaluation": dict(evaluation or {}),
        "what_if_bandwidths": {str(k): v for k, v in (what_if or {}).items()},
    }
    path = Path(run_dir) / "partitioners.json"
    atomic_write(path, json.dumps(doc, indent=2, default=str) + "\n")
    return path


def medians_from_splits(splits: Iterable[Mapping]) -> dict[int, float]:
    """``{split: e2e_ms_median}`` from ``summary.json``'s ``splits`` rows."""
    return {
        int(r["split"]): float(r["e2e_ms_median"])
        for r in splits
        if r.get("e2e_ms_median") is not None
    }


def evaluate_run(
    names: Iterable[str | Mapping],
    ctx: Mapping | Any,
    splits: Iterable[Mapping],
    run_dir: str | Path | None = None,
    bandwidths_Bps: Sequence[float] = (),
) -> dict:
    """The observer's one call after a sweep: score, write ``partitioners.json``, return the summary block.

    ``ctx`` is the edge's partition context (a ``PartitionContext`` or its
    ``to_dict()``, profiles and probed network included); ``splits`` are
    ``summary["splits"]`` rows; ``bandwidths_Bps`` (e.g. the manifest's
    ``network.bandwidths``) adds the predicted choice at each rate to
    ``partitioners.json`` (``what_if_bandwidths``). Returns ``summary_view(...)``
    for ``summary["partitioners"]``.
    """
    from experiment_design.partitioners import PartitionContext

    names = list(names)
    if not isinstance(ctx, PartitionContext):
        ctx = PartitionContext.from_dict(dict(ctx))
    evaluation = evaluate_partitioners(names, ctx, medians_from_splits(splits))
    if run_dir is not None:
        what_if = bandwidth_what_if(names, ctx, bandwidths_Bps) if bandwidths_Bps else None
        write_partitioners_json(run_dir, ctx, evaluation=evaluation, what_if=what_if)
    return summary_view(evaluation)
