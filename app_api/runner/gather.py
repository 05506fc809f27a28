"""Gather phase: environment.json, summary.json (with partitioner scores) and the plots."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from app_api.results import build_summary
from app_api.runner.evaluate import evaluate_run, measurement_noise
from app_api.runner.state import RunState
from app_api.units import parse_rate

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What a run produced: its directory, summary and whether every inference succeeded."""

    run_dir: Path
    summary: dict
    ok: bool
    errors: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 ok, 1 some inference failed or a participant died."""
        return 0 if self.ok else 1


def gather(state: RunState, interrupted: bool) -> RunResult:
    """Close the record files and write what the run measured; return the result."""
    w = state.writer
    w.close()
    w.write_json("environment.json", state.envs)
    model = dict(state.manifest.model)
    weights = "pretrained" if model.get("weights") else "random"
    failed_rows = [r for r in w.rows if r.get("error")]
    ok = not state.errors and not failed_rows and not interrupted
    t = state.times
    summary = build_summary(
        w.rows,
        experiment=state.manifest.name,
        run_id=w.run_id,
        status="interrupted" if interrupted else ("ok" if ok else "failed"),
        wall_s=t.get("wall_s"),
        deploy_s=t.get("deploy_s"),
        deploy_phases={k: t.get(k) for k in ("start_s", "setup_s")},
        warmup_s=t.get("warmup_s"),
        teardown_s=t.get("teardown_s"),
        model=model.get("name"),
        weights=weights,
        mode=next((i.mode for i in state.infos.values() if i), None),
        threads={i: e.get("threads") for i, e in state.envs.items()},
        layer_rows=w.n_layers,
        errors=state.errors,
        **state.extra,
    )
    if state.eval_ctx is not None and summary["splits"]:
        summary["partitioners"] = score_partitioners(state, summary, w.dir)
        summary["measurement_noise"] = measurement_noise(w.rows)
    w.write_json("summary.json", summary)
    try:
        from app_api.results.plots import draw  # matplotlib: only once there is something to draw

        draw(summary, w.dir)
    except Exception as exc:  # a plot must never lose a run
        log.warning("plots not drawn: %s", exc)
    return RunResult(run_dir=w.dir, summary=summary, ok=ok, errors=list(state.errors))


def score_partitioners(state: RunState, summary: dict, run_dir: Path) -> dict | None:
    """Score the manifest's ``evaluate.partitioners`` against this sweep."""
    m = state.manifest
    try:
        rates = [parse_rate(bw) for bw in (m.network or {}).get("bandwidths") or []]
        return evaluate_run(m.evaluate["partitioners"], state.eval_ctx, summary["splits"],
                            run_dir, rates)
    except Exception as exc:  # scoring must never lose the run's own results
        log.warning("partitioner evaluation failed: %s", exc)
        summary.setdefault("warnings", []).append(f"partitioner evaluation failed: {exc}")
        return None
