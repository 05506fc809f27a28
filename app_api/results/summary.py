"""Per-split statistics from inference rows (failed rows counted, never averaged in).

A run that swept transports (a codec sweep: every split sent with several) has one row
set per (split, transport) pair, whose costs differ by up to tens of times at one split
(AlexNet's input: 20 ms as JPEG, 175 ms raw, at 4 MB/s). A median pooled over them is no
split's cost, so the per-split statistics of such a run are those of one transport
(:func:`split_transport`): the run's own, which a split-only partitioner sends with; the
pairs have their own table (:mod:`app_api.results.fidelity`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from app_api.results.dispersion import best_set, mad, median_interval


def num(v) -> float | None:
    """A CSV cell as a float; None for an empty, non-numeric or NaN cell."""
    if v is None or v == "":
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty list."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _median(rows: list[dict], key: str) -> float | None:
    vals = [v for v in (num(r.get(key)) for r in rows) if v is not None]
    return statistics.median(vals) if vals else None


def split_stats(rows: Iterable[dict]) -> list[dict]:
    """One object per split point (ascending): medians/p95 over the successful rows."""
    by_split: dict[int, list[dict]] = {}
    failed: dict[int, int] = {}
    layer: dict[int, str] = {}
    for r in rows:
        k = int(r["split"])
        layer.setdefault(k, str(r.get("layer", "")))
        if r.get("error"):
            failed[k] = failed.get(k, 0) + 1
            by_split.setdefault(k, [])
            continue
        by_split.setdefault(k, []).append(r)
    out = []
    for k in sorted(by_split):
        ok = by_split[k]
        e2e = [v for v in (num(r.get("e2e_ms")) for r in ok) if v is not None]
        out.append({
            "split": k,
            "layer": layer.get(k, ""),
            "count": len(ok),
            "failed": failed.get(k, 0),
            "e2e_ms_median": statistics.median(e2e) if e2e else None,
            # p50 is the median; p90/p99 of few samples are the largest ones (count says)
            "e2e_ms_p50": percentile(e2e, 50) if e2e else None,
            "e2e_ms_p90": percentile(e2e, 90) if e2e else None,
            "e2e_ms_p95": percentile(e2e, 95) if e2e else None,
            "e2e_ms_p99": percentile(e2e, 99) if e2e else None,
            # the median's noise: read two medians as different only where they separate
            "e2e_ms_mad": mad(e2e),
            "e2e_ms_ci95": median_interval(e2e, k),
            "edge_ms_median": _median(ok, "edge_ms"),
            "encode_ms_median": _median(ok, "encode_ms"),
            "transfer_ms_median": _median(ok, "transfer_ms"),
            "decode_ms_median": _median(ok, "decode_ms"),
            "cloud_ms_median": _median(ok, "cloud_ms"),
            # CPU time of the process over the same span: wall far above it means the
            # participant waited (a CPU quota's stalls, a busy neighbour), not computed
            "edge_cpu_ms_median": _median(ok, "edge_cpu_ms"),
            "cloud_cpu_ms_median": _median(ok, "cloud_cpu_ms"),
            "bytes_raw": _median(ok, "bytes_raw"),
            "bytes_encoded": _median(ok, "bytes_encoded"),
        })
    for s in out:
        for key in ("bytes_raw", "bytes_encoded"):
            if s[key] is not None:
                s[key] = int(s[key])
    return out


def best_split(splits: list[dict]) -> int | None:
    """The split with the lowest median end-to-end latency."""
    cands = [s for s in splits if s["e2e_ms_median"] is not None]
    return min(cands, key=lambda s: s["e2e_ms_median"])["split"] if cands else None


def e2e_samples(rows: Iterable[dict]) -> dict[int, list[float]]:
    """``{split: [e2e ms, ...]}`` of the successful rows, in the order they ran."""
    out: dict[int, list[float]] = {}
    for r in rows:
        v = None if r.get("error") else num(r.get("e2e_ms"))
        if v is not None:
            out.setdefault(int(r["split"]), []).append(v)
    return out


#: what a transport label starts with when the transport loses information
LOSSY_LABELS = ("fp16", "bf16", "int8", "int4", "jpeg", "webp")


def split_transport(rows: Iterable[dict], preferred: str | None = None) -> str | None:
    """The transport whose rows the per-split statistics are taken from, or None when the
    rows were sent with one transport only (rows of one stage, label ``""``, carry none).
    ``preferred`` (the run's own transport label) when it was swept, else the first
    lossless label in sorted order, else the first label."""
    labels = sorted({str(r.get("transport") or "") for r in rows if not r.get("error")} - {""})
    if len(labels) < 2:
        return None
    if preferred in labels:
        return preferred
    lossless = [t for t in labels if "+" not in t and not t.startswith(LOSSY_LABELS)]
    return (lossless or labels)[0]


def rows_of_transport(rows: list[dict], label: str | None) -> list[dict]:
    """The rows sent with ``label`` and those of one stage (no transport); all with None."""
    if label is None:
        return rows
    return [r for r in rows if str(r.get("transport") or "") in (label, "")]


def build_summary(rows: list[dict], transport: str | None = None, **meta) -> dict:
    """summary.json content: meta keys + inferences, failed, splits, best_split, best_set
    (the splits not separated from the best at 95%, :func:`~app_api.results.dispersion.
    best_set`), sum_e2e_s, overhead (wall_s / sum of e2e).

    ``transport``: the run's own transport label. Where the rows were sent with several
    transports, splits, best_split and best_set are those of one (:func:`split_transport`),
    named under ``split_transport``; inferences, failed and sum_e2e_s count every row.

    A resumed run (``resumed_from`` with the ``rows`` it copied) counts all its rows in the
    statistics, but ``sum_e2e_s`` and ``overhead`` only over the rows measured in its own
    ``wall_s``: the copied ones were timed by the run it resumes."""
    label = split_transport(rows, transport)
    own = rows_of_transport(rows, label)
    splits = split_stats(own)
    failed = sum(1 for r in rows if r.get("error"))
    copied = int((meta.get("resumed_from") or {}).get("rows") or 0)
    e2e_sum = sum(v for v in (num(r.get("e2e_ms")) for r in rows[copied:] if not r.get("error"))
                  if v is not None) / 1e3
    summary = dict(meta)
    summary.update(
        inferences=len(rows),
        failed=failed,
        sum_e2e_s=e2e_sum,
        splits=splits,
        best_split=best_split(splits),
        best_set=best_set(e2e_samples(own)),
    )
    if label is not None:
        summary["split_transport"] = {
            "label": label, "run_transport": transport, "inferences": len(own),
            "note": f"per-split figures are the {label} rows'; every (split, transport) pair "
                    "is under codecs.pairs"}
    wall = num(summary.get("wall_s"))
    summary["overhead"] = (wall / e2e_sum) if wall and e2e_sum > 0 else None
    return summary
