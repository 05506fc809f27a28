"""Rate against fidelity: per (split, transport) pair, the bytes at the cut and how faithful
the output stayed; the Pareto-optimal pairs; and the answer to "at this bandwidth and this
fidelity floor, which pair is fastest end to end, and does it beat sending a compressed
input?".

A pair's end-to-end time at a bandwidth is its measured compute, encode and decode medians
plus its median encoded bytes over that bandwidth (the wire time the run itself saw on
its own link is left out, so pairs are compared at the stated rate, not the run's).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from app_api.results.summary import num
from app_api.units import parse_rate

#: the fidelity floor (top-1 agreement with the unsplit model) when the manifest sets none
DEFAULT_FLOOR = 0.99
#: transports that compress the model's input as an image (the compressed-input baseline)
INPUT_CODECS = ("jpeg", "webp")


def is_input_baseline(split: int, transport: str) -> bool:
    """A pair that sends the input compressed as an image (split 0, jpeg or webp)."""
    return split == 0 and any(transport.startswith(c) for c in INPUT_CODECS)


def _vals(rows: list[dict], key: str) -> list[float]:
    return [v for v in (num(r.get(key)) for r in rows) if v is not None]


def _median(rows: list[dict], key: str) -> float | None:
    vals = _vals(rows, key)
    return statistics.median(vals) if vals else None


def pair_stats(rows: Iterable[dict]) -> list[dict]:
    """One object per (split, transport) pair, by split then transport: medians of bytes
    and times over its successful rows, its top-1 agreement rate, cosine min and median,
    the largest max abs difference and (real weights, labelled data) its accuracy."""
    groups: dict[tuple[int, str], list[dict]] = {}
    failed: dict[tuple[int, str], int] = {}
    layer: dict[int, str] = {}
    for r in rows:
        key = (int(r["split"]), str(r.get("transport") or ""))
        layer.setdefault(key[0], str(r.get("layer", "")))
        groups.setdefault(key, [])
        if r.get("error"):
            failed[key] = failed.get(key, 0) + 1
        else:
            groups[key].append(r)
    out = []
    for (k, t), ok in sorted(groups.items()):
        agree, cos = _vals(ok, "top1_agree"), _vals(ok, "cosine")
        correct = _vals(ok, "correct")
        diff = _vals(ok, "max_abs_diff")
        enc = _median(ok, "bytes_encoded")
        raw = _median(ok, "bytes_raw")
        out.append({
            "split": k, "layer": layer.get(k, ""), "transport": t,
            "count": len(ok), "failed": failed.get((k, t), 0),
            "bytes_raw": None if raw is None else int(raw),
            "bytes_encoded": None if enc is None else int(enc),
            "encode_ms_median": _median(ok, "encode_ms"),
            "decode_ms_median": _median(ok, "decode_ms"),
            "edge_ms_median": _median(ok, "edge_ms"),
            "cloud_ms_median": _median(ok, "cloud_ms"),
            "e2e_ms_median": _median(ok, "e2e_ms"),
            "top1_agreement": sum(agree) / len(agree) if agree else None,
            "cosine_min": min(cos) if cos else None,
            "cosine_median": statistics.median(cos) if cos else None,
            "max_abs_diff_max": max(diff) if diff else None,
            "accuracy": sum(correct) / len(correct) if correct else None,
            "input_baseline": is_input_baseline(k, t),
        })
    mark_pareto(out)
    return out


def mark_pareto(pairs: list[dict]) -> None:
    """Set ``pareto`` on each pair: True when no other pair sends no more bytes with no
    lower cosine median and is better in one of the two (pairs lacking either: False)."""
    def usable(p: dict) -> bool:
        return p.get("bytes_encoded") is not None and p.get("cosine_median") is not None

    for p in pairs:
        p["pareto"] = usable(p) and not any(
            usable(q) and q is not p
            and q["bytes_encoded"] <= p["bytes_encoded"]
            and q["cosine_median"] >= p["cosine_median"]
            and (q["bytes_encoded"] < p["bytes_encoded"]
                 or q["cosine_median"] > p["cosine_median"])
            for q in pairs)


def predicted_ms(pair: dict, bandwidth_Bps: float) -> float | None:
    """Compute + encode + decode medians + median encoded bytes at ``bandwidth_Bps``."""
    parts = [pair.get(k) for k in ("edge_ms_median", "encode_ms_median", "decode_ms_median",
                                   "cloud_ms_median", "bytes_encoded")]
    if any(v is None for v in parts) or bandwidth_Bps <= 0:
        return None
    *ms, nbytes = parts
    return sum(ms) + nbytes / bandwidth_Bps * 1e3


def answer(pairs: list[dict], bandwidth_Bps: float, floor: float = DEFAULT_FLOOR,
           label: str = "") -> dict:
    """At ``bandwidth_Bps``, the fastest pair whose top-1 agreement is at least ``floor``,
    the fastest compressed-input pair that meets the floor, and whether the first beats
    the second (None when either is missing)."""
    def entry(p: dict, ms: float) -> dict:
        return {"split": p["split"], "layer": p["layer"], "transport": p["transport"],
                "ms": ms, "bytes": p["bytes_encoded"], "top1_agreement": p["top1_agreement"],
                "cosine_median": p["cosine_median"]}

    timed = [(p, predicted_ms(p, bandwidth_Bps)) for p in pairs
             if p.get("top1_agreement") is not None and p["top1_agreement"] >= floor]
    timed = [(p, ms) for p, ms in timed if ms is not None]
    best = min(timed, key=lambda pm: pm[1], default=None)
    base = min(((p, ms) for p, ms in timed if p["input_baseline"]), key=lambda pm: pm[1],
               default=None)
    out: dict = {"bandwidth": label or f"{bandwidth_Bps:.0f} B/s",
                 "bandwidth_Bps": bandwidth_Bps, "floor": floor,
                 "fastest": entry(*best) if best else None,
                 "baseline": entry(*base) if base else None,
                 "baselines_measured": sum(1 for p in pairs if p["input_baseline"]),
                 "beats_baseline": None, "speedup": None}
    if best and base:
        out["beats_baseline"] = not best[0]["input_baseline"] and best[1] < base[1]
        out["speedup"] = base[1] / best[1] if best[1] > 0 else None
    return out


def run_rates(summary: dict, bandwidths: Iterable | None = None) -> list[tuple[str, float]]:
    """The bandwidths to answer at: the ones given (rates as ``4MB/s``), then the run's
    own link (the lab's measured link, else the head's probed one)."""
    out = [(str(b), parse_rate(b)) for b in (bandwidths or [])]
    lab = (summary.get("network") or {}).get("lab") or {}
    if num(lab.get("bandwidth_Bps")):
        conf = (lab.get("configured") or {}).get("bandwidth")
        out.append((f"lab link{f' ({conf})' if conf else ''}", float(lab["bandwidth_Bps"])))
        return out
    for inst, link in sorted((summary.get("network") or {}).items()):
        if inst != "lab" and isinstance(link, dict) and num(link.get("bandwidth_Bps")):
            out.append((f"probed {inst} link", float(link["bandwidth_Bps"])))
            break
    return out


def codec_summary(rows: list[dict], summary: dict, params: dict | None = None) -> dict | None:
    """summary.json's ``codecs`` section, or None when the run sent with one transport
    only: the per-pair table (``pairs``), the ``floor``, and one ``answers`` entry per
    bandwidth. ``params`` are the partitioner's (``transports``, ``fidelity_floor``,
    ``bandwidths``)."""
    params = params or {}
    labels = {str(r.get("transport") or "") for r in rows if not r.get("error")}
    if not params.get("transports") and len(labels - {""}) < 2:
        return None
    pairs = pair_stats(rows)
    floor = float(params.get("fidelity_floor", DEFAULT_FLOOR))
    out = {"pairs": pairs, "floor": floor, "fidelity": "top-1 agreement with the unsplit "
           "model; cosine and max abs difference of its outputs",
           "pareto": "bytes at the cut (lower) against cosine median (higher)",
           "answers": [answer(pairs, bps, floor, label)
                       for label, bps in run_rates(summary, params.get("bandwidths"))]}
    if summary.get("weights") != "pretrained":
        out["note"] = "random weights: no accuracy; fidelity is agreement with the unsplit model"
    return out
