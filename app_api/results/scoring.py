"""Observer-side scoring of partitioners against a measured sweep.

After a cyclic sweep the observer knows the measured median end-to-end time
of every split. Each partitioner named in the manifest's
``evaluate.partitioners`` is set up on the same start-up measurements (the
profiles and the probed link) and scored: did it pick the measured best split
(``regret = chosen_ms / best_ms``, 1.0 is perfect), and how well does its
predicted latency rank the splits (Spearman's rank correlation between its
predicted and the measured totals across split points)? Where the measurements cannot
tell the chosen split from the best (it is in the sweep's *best set*, the splits not
separated from the best at 95%, :func:`app_api.results.dispersion.best_set`), the choice
is also reported as a tie (``tie: true``): its regret above 1.0 is within the noise.

A partitioner that chooses the transport too (``split-codec``, whose ``needs`` has
``fidelity``) is scored, on a (split, transport) sweep, against the measured pairs:
``regret = its pair's measured median / the best measured median among the pairs whose
measured fidelity meets the same floor``, and whether its pair meets the floor as measured.

The scored partitioners are built from the manifest's entries by
:mod:`app_api.results.scored`; how far the measured best itself moves with noise is
:mod:`app_api.results.noise`.
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
from app_api.results import dispersion
from app_api.results.scored import create_scored, entry_spec, needs_fidelity
from experiment_design.errors import TracrError
from experiment_design.partitioners import PartitionContext
from experiment_design.partitioners.predicted import summarize_inputs
from experiment_design.partitioners.split_codec import meets

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


#: a prediction within this share of the measured median counts as accurate
ACCURACY_TOLERANCE = 0.10


def within_share(predicted: Sequence[float], measured: Sequence[float],
                 tolerance: float = ACCURACY_TOLERANCE) -> float | None:
    """The share of predictions within ``tolerance`` of the measured value
    (``|predicted - measured| <= tolerance * measured``), nn-Meter's figure of merit for a
    latency predictor (there: +/-10%); None with no pair."""
    pairs = [(p, m) for p, m in zip(predicted, measured, strict=True) if m and m > 0]
    if not pairs:
        return None
    return sum(1 for p, m in pairs if abs(p - m) <= tolerance * m) / len(pairs)


def _num(x: Any) -> float | None:
    return None if x is None else float(x)


#: the measured pair column each floor metric of split-codec reads
_MEASURED_METRIC = {"top1_agree": "top1_agreement", "cosine": "cosine_min"}


def score_pairs(name: str, params: Mapping, ctx: Any, pairs: Sequence[Mapping],
                sweep: Mapping | None = None,
                samples: Mapping[tuple[int, str], Sequence[float]] | None = None) -> dict:
    """Score a partitioner that picks a (split, transport) pair against the measured pairs
    (``summary["codecs"]["pairs"]``): set up on ``ctx`` (its fidelity probe included) among
    the measured splits, its pair's measured median over the best measured median of the
    pairs whose measured fidelity meets its floor. With ``samples``
    (:func:`app_api.results.noise.pair_samples`) the result gains ``in_best_set`` and
    ``tie``: its pair is among those that meet the floor and that the measurements cannot
    separate from the best of them (the summary's best-set rule, over pairs). Raises
    TracrError when it cannot decide."""
    measured = {(int(p["split"]), str(p["transport"])): p for p in pairs
                if p.get("e2e_ms_median") is not None}
    splits = {k for k, _ in measured}
    run_ctx = dataclasses.replace(
        ctx, valid_splits=[k for k in ctx.valid_splits if k in splits] or list(ctx.valid_splits))
    part = create_scored(name, params, sweep)
    part.setup(run_ctx)
    dec = json.loads(json.dumps(part.decision(), default=str))
    floor = dec["floor"]
    col = _MEASURED_METRIC[floor["metric"]]
    above = [p for p in measured.values() if meets(p.get(col), floor)]
    best = min(above, key=lambda p: (p["e2e_ms_median"], p["split"], p["transport"]),
               default=None)
    key = (int(dec["chosen"]), str(dec["transport"]))
    mine = measured.get(key)
    chosen_ms = _num(mine["e2e_ms_median"]) if mine else None
    best_ms = _num(best["e2e_ms_median"]) if best else None
    predicted = {(int(r["split"]), str(r["transport"])): float(r["predicted_ms"])
                 for r in dec.get("pairs") or []}
    common = sorted(set(predicted) & set(measured))
    notes = list(dec.get("notes") or [])
    tie: dict = {}
    if samples is not None and mine is not None and above:
        tie["in_best_set"] = key in pair_best_set(above, samples)
        tie["tie"] = tie["in_best_set"]
    if mine is None:
        notes.append(f"chosen pair {key} was not measured in the sweep")
    if best is None:
        notes.append(f"no measured pair meets {floor['metric']} >= {floor['min']}")
    return {
        "name": name, "chosen": key[0], "transport": key[1], "chosen_ms": chosen_ms,
        "best": best["split"] if best else None,
        "best_transport": best["transport"] if best else None, "best_ms": best_ms,
        "regret": chosen_ms / best_ms if chosen_ms is not None and best_ms else None,
        "floor": floor,
        "meets_floor_measured": None if mine is None else meets(mine.get(col), floor),
        "meets_floor_probed": (dec.get("fidelity") or {}).get("meets_floor"),
        "measured_fidelity": None if mine is None else {
            "top1_agreement": mine.get("top1_agreement"), "cosine_min": mine.get("cosine_min")},
        "spearman": spearman([predicted[k] for k in common], [measured[k]["e2e_ms_median"]
                                                            for k in common]),
        "spearman_n": len(common),
        "within_10pct": within_share([predicted[k] for k in common],
                                     [measured[k]["e2e_ms_median"] for k in common]),
        "predicted_chosen_ms": _num(dec.get("chosen_ms")),
        "criterion": dec.get("criterion"),
        "notes": notes,
        "decision": dec,
        **tie,
    }


def pair_best_set(candidates: Iterable[Mapping],
                  samples: Mapping[tuple[int, str], Sequence[float]]) -> set[tuple[int, str]]:
    """The (split, transport) pairs among ``candidates`` (pair rows) that the samples cannot
    separate from the fastest of them: :func:`app_api.results.dispersion.best_set` over the
    pairs, numbered in (split, transport) order so the seeds do not depend on the caller."""
    keys = sorted({(int(p["split"]), str(p["transport"])) for p in candidates})
    found = dispersion.best_set({i: samples.get(k, []) for i, k in enumerate(keys)})
    return {keys[i] for i in (found or {}).get("splits", [])}


def evaluate_partitioners(
    names: Iterable[str | Mapping],
    ctx: Any,
    measured_medians: Mapping[int, float],
    pairs: Sequence[Mapping] | None = None,
    sweep: Mapping | None = None,
    best_set: Iterable[int] | None = None,
    pair_samples: Mapping[tuple[int, str], Sequence[float]] | None = None,
    split_transport: str | None = None,
) -> dict:
    """Score partitioners against measured medians.

    ``names``: partitioner names, or ``{name, params, label}`` dicts (the same
    partitioner with different params, e.g. ``criterion: ineq4``, under its
    own label). ``ctx``: the run's ``PartitionContext`` (profiles, network);
    its ``measured`` is replaced by ``measured_medians`` (``{split: ms}``).

    Returns ``{label: {chosen, chosen_ms, best, best_ms, regret, spearman,
    predicted, criterion, decision}}``; a partitioner that cannot decide
    (e.g. no profile) gets ``{"error": message}`` instead of failing the
    whole summary. With ``pairs`` (a (split, transport) sweep's measured pairs) a
    partitioner that needs ``fidelity`` is scored by :func:`score_pairs` instead, with
    ``sweep`` (the sweep's params) giving it the sweep's transports. With ``best_set``
    (``summary["best_set"]["splits"]``) a split-only result gains ``in_best_set`` and
    ``tie`` (true when its chosen split is in the set); regret stays the headline.
    ``pair_samples`` does the same for a pair-choosing partitioner (:func:`score_pairs`).
    ``split_transport`` (a codec sweep's: the transport whose rows ``measured_medians``
    are, ``summary["split_transport"]``) is named as ``scored_on`` in each split-only
    result.
    """
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
    resolved = None if best_set is None else {int(k) for k in best_set}

    out: dict[str, dict] = {}
    for entry in names:
        label, name, params = entry_spec(entry)
        if pairs and needs_fidelity(name):
            try:
                out[label] = score_pairs(name, params, ctx, pairs, sweep, pair_samples)
            except TracrError as e:
                log.warning("partitioner %s could not decide: %s", label, e)
                out[label] = {"name": name, "error": str(e), "hint": e.hint}
            continue
        try:
            part = create_scored(name, params, sweep)
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
            "within_10pct": within_share([predicted[k] for k in common],
                                         [measured[k] for k in common]),
            "predicted": predicted or None,
            "predicted_chosen_ms": _num(predicted.get(chosen)) if chosen is not None else None,
            "criterion": dec.get("criterion"),
            "notes": dec.get("notes", []),
            "decision": dec,
        }
        if split_transport:
            out[label]["scored_on"] = split_transport
        if resolved is not None:
            inside = chosen_ms is not None and int(chosen) in resolved
            out[label].update(in_best_set=inside, tie=inside)
        if chosen is not None and chosen_ms is None:
            out[label]["notes"] = [
                *out[label]["notes"],
                f"chosen split {chosen} was not measured in the sweep",
            ]
    return out


def summary_view(evaluation: Mapping[str, Mapping]) -> dict:
    """The compact per-partitioner block for ``summary.json["partitioners"]``."""
    keys = ("chosen", "transport", "chosen_ms", "best", "best_transport", "best_ms", "regret",
            "spearman", "within_10pct", "in_best_set", "tie", "floor", "meets_floor_measured",
            "scored_on", "criterion", "error")
    return {label: {k: ev[k] for k in keys if k in ev} for label, ev in evaluation.items()}


def bandwidth_what_if(
    names: Iterable[str | Mapping], ctx: Any, bandwidths_Bps: Sequence[float],
    sweep: Mapping | None = None,
) -> dict:
    """How each partitioner's choice moves with link bandwidth, from the same profiles.

    Predictions only (no new measurement): the context's network is replaced
    by each bandwidth in turn, keeping the probed rtt. Returns
    ``{bandwidth: {label: {chosen, predicted_chosen_ms}}}``.
    """
    rtt = float((ctx.network or {}).get("rtt_ms") or 0.0)
    out: dict[float, dict] = {}
    for bw in bandwidths_Bps:
        c = dataclasses.replace(
            ctx, network={"bandwidth_Bps": float(bw), "rtt_ms": rtt, "source": "what-if"}
        )
        row = {}
        for entry in names:
            label, name, params = entry_spec(entry)
            if name == "measured":
                continue  # needs a real sweep at that bandwidth
            try:
                part = create_scored(name, params, sweep)
                part.setup(c)
            except TracrError as e:
                row[label] = {"error": str(e)}
                continue
            dec = part.decision()
            row[label] = {"chosen": dec["chosen"], "predicted_chosen_ms": dec.get("chosen_ms")}
            if dec.get("transport"):
                row[label]["transport"] = dec["transport"]
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
    doc = {
        "inputs": {
            **summarize_inputs(ctx),
            "edge_profile": ctx.edge_profile,
            "cloud_profile": ctx.cloud_profile,
            "points": [
                {k: p.get(k) for k in ("index", "layer", "crossing_bytes", "valid")}
                for p in ctx.points
            ],
            "fidelity": getattr(ctx, "fidelity", None),
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
    pairs: Sequence[Mapping] | None = None,
    sweep: Mapping | None = None,
    best_set: Iterable[int] | None = None,
    pair_samples: Mapping[tuple[int, str], Sequence[float]] | None = None,
    split_transport: str | None = None,
) -> dict:
    """The observer's one call after a sweep: score, write ``partitioners.json``, return the summary block.

    ``ctx`` is the edge's partition context (a ``PartitionContext`` or its
    ``to_dict()``, profiles and probed network included); ``splits`` are
    ``summary["splits"]`` rows; ``bandwidths_Bps`` (e.g. the manifest's
    ``network.bandwidths``) adds the predicted choice at each rate to
    ``partitioners.json`` (``what_if_bandwidths``); ``pairs`` (``summary["codecs"]
    ["pairs"]``) and ``sweep`` (the sweep's partitioner params) score pair-choosing
    partitioners against the measured pairs; ``best_set`` (``summary["best_set"]
    ["splits"]``) marks the choices the sweep cannot tell from the best as ties, and
    ``pair_samples`` (:func:`app_api.results.noise.pair_samples` of the rows) a pair's;
    ``split_transport`` names the transport of ``splits`` on a codec sweep. Returns
    ``summary_view(...)`` for ``summary["partitioners"]``.
    """
    names = list(names)
    if not isinstance(ctx, PartitionContext):
        ctx = PartitionContext.from_dict(dict(ctx))
    evaluation = evaluate_partitioners(names, ctx, medians_from_splits(splits), pairs, sweep,
                                       best_set, pair_samples, split_transport)
    if run_dir is not None:
        what_if = (bandwidth_what_if(names, ctx, bandwidths_Bps, sweep) if bandwidths_Bps
                   else None)
        write_partitioners_json(run_dir, ctx, evaluation=evaluation, what_if=what_if)
    return summary_view(evaluation)
