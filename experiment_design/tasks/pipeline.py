"""The pipeline task: measure configurations of a chain, each in each mode, plus baselines."""

from __future__ import annotations

import logging
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.tasks.base import Task, register_task

log = logging.getLogger(__name__)

MODES = ("throughput", "latency")


@register_task("infer-pipeline")
class InferPipeline(Task):
    """For every placement the partitioner plans (a route and its cuts), ``count``
    inferences in each of ``modes`` ("throughput": up to ``in_flight`` in the chain at
    once; "latency": one at a time), then, with ``baselines``, each participant of the
    chain running the whole model alone. Defaults come from the manifest's ``pipeline``
    section; one ``configs.csv`` row per configuration and mode.
    """

    requires = "run_config"

    def _opts(self, participant: Any) -> dict[str, Any]:
        pipe = participant.config.pipeline
        cfg = {**(pipe.to_dict() if pipe else {}), **self.params}
        modes = cfg.get("modes") or list(MODES)
        if isinstance(modes, str):
            modes = [modes]
        bad = [m for m in modes if m not in MODES]
        if bad:
            raise TracrError(f"infer-pipeline: unknown mode {bad[0]!r}",
                             hint=f"use {' or '.join(MODES)}")
        return {"modes": modes, "count": int(cfg.get("count") or 32),
                "in_flight": int(cfg.get("in_flight") or 4),
                "baselines": bool(cfg.get("baselines", True))}

    def run(self, participant: Any) -> None:
        """Measure every planned configuration; stop early if asked."""
        self.check(participant)
        opts = self._opts(participant)
        placements = participant.placements()
        devices = list(dict.fromkeys(d for route, _ in placements for d in route.route))
        total = len(placements) * len(opts["modes"]) * opts["count"]
        participant.progress(done=0, total=total)
        log.info("infer-pipeline: %d configurations x %s, %d inferences each",
                 len(placements), "/".join(opts["modes"]), opts["count"])
        base = 0
        for route, predicted in placements:
            for mode in opts["modes"]:
                if participant.cancel_event.is_set() or participant.stop_event.is_set():
                    raise TracrError("stopped before the end of infer-pipeline")
                participant.progress_base = base
                participant.progress(split=route.cuts[0] if route.cuts else None)
                participant.run_config(route, mode, opts["count"], opts["in_flight"],
                                       predicted=predicted)
                base += opts["count"]
        if opts["baselines"]:
            for dev in devices:
                res = participant.solo(dev, opts["count"])
                participant.emit_config({
                    "cuts": [], "chain": [dev], "mode": "single", "batch": participant.batch,
                    "in_flight": 1, "inferences": opts["count"],
                    "items": opts["count"] * participant.batch, "errors": 0,
                    "throughput_per_s": res["throughput_per_s"],
                    "items_per_s": (res["throughput_per_s"] or 0) * participant.batch,
                    "latency_ms_p50": res["latency_ms_p50"]})
