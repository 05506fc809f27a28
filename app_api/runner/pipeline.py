"""What a pipeline run adds to ``summary.json``: the chosen configuration's throughput,
its bound and stages, and the speed-ups over the baselines measured in the same run."""

from __future__ import annotations

from typing import Any


def pipeline_summary(configs: list[dict]) -> dict[str, Any]:
    """``throughput_per_s``, ``bound_per_s``, ``stages`` of the first configuration measured
    in throughput mode (the partitioner's choice when it chose one), and ``pipeline``:
    every configuration plus the ratios ``throughput_over_bound``,
    ``pipelined_over_sequential`` (the same cuts, one inference at a time) and
    ``pipelined_over_single`` (the best participant running the whole model alone)."""
    if not configs:
        return {}
    piped = [c for c in configs if c.get("mode") == "throughput" and c.get("throughput_per_s")]
    main = piped[0] if piped else next((c for c in configs if c.get("mode") != "single"), None)
    singles = [c for c in configs if c.get("mode") == "single" and c.get("throughput_per_s")]
    best_single = max(singles, key=lambda c: c["throughput_per_s"], default=None)
    out: dict[str, Any] = {"pipeline": {"configs": configs, "chosen": None, "ratios": {}}}
    if main is None:
        return out
    thr = main.get("throughput_per_s")
    same = next((c for c in configs if c.get("mode") == "latency"
                 and list(c.get("cuts") or []) == list(main.get("cuts") or [])
                 and list(c.get("chain") or []) == list(main.get("chain") or [])), None)
    ratios = {
        "throughput_over_bound": _ratio(thr, main.get("bound_per_s")),
        "pipelined_over_sequential": _ratio(thr, (same or {}).get("throughput_per_s")),
        "pipelined_over_single": _ratio(thr, (best_single or {}).get("throughput_per_s")),
        "predicted_over_measured": _ratio(main.get("predicted_throughput_per_s"), thr),
    }
    out["pipeline"].update(
        chosen={k: main.get(k) for k in ("cuts", "chain", "mode", "in_flight")},
        best_single=(best_single or {}).get("chain", [None])[0], ratios=ratios)
    out.update(throughput_per_s=thr, bound_per_s=main.get("bound_per_s"),
               stages=main.get("stages") or [])
    return out


def _ratio(a: Any, b: Any) -> float | None:
    return float(a) / float(b) if a and b else None
