"""Gather phase: environment.json, summary.json (with partitioner scores) and the plots."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from app_api.results import ResultsWriteError, build_summary
from app_api.results.adaptive import adaptive_summary, write_link_csv
from app_api.results.budget import run_budget, warmup_count, write_holds_csv
from app_api.results.energy import score_energy
from app_api.results.fidelity import codec_summary
from app_api.results.figures import draw_kinds
from app_api.results.metrics import metrics_summary, write_metrics
from app_api.results.noise import measurement_noise, pair_noise, pair_samples
from app_api.results.report import write_report
from app_api.results.scoring import evaluate_run
from app_api.results.store import STAGES_FILE, complete_rows
from app_api.results.summary import rows_of_transport
from app_api.runner.pipeline import pipeline_summary
from app_api.runner.state import RunState
from app_api.units import parse_rate
from experiment_design.errors import TracrError
from experiment_design.transport.codec import CodecConfig

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


def incomplete_reason(state: RunState, interrupted: bool) -> str | None:
    """Why the run did not finish its plan (None when it did): the liveness checks' reason
    (a lost partner, ``run.timeout_s``), a results file that could not be written, or a stop."""
    reason = getattr(state, "incomplete_reason", None)
    failure = getattr(state.writer, "failure", None)
    if not reason and failure is not None:
        reason = failure.reason
    if not reason and interrupted:
        reason = "interrupted"
    return reason


def gather(state: RunState, interrupted: bool) -> RunResult:
    """Close the record files and write what the run measured; return the result.

    Always leaves a readable ``summary.json``: when the full one cannot be written (a full
    disk) a small one says so; an incomplete run carries ``incomplete: {reason}``.
    """
    w = state.writer
    w.close()
    try:
        w.write_json("environment.json", state.envs)
    except ResultsWriteError as exc:
        state.errors.append(str(exc))
    model = dict(state.manifest.model)
    weights = "pretrained" if model.get("weights") else "random"
    # A resumed run keeps the rows of the run it continues, failed ones too (as measured),
    # but redoes those failures itself: only its own rows can fail it. (Counting the copied
    # ones failed every resume of a run with one failed inference, for ever.)
    copied = int((getattr(w, "resumed_from", None) or {}).get("rows") or 0)
    failed_rows = [r for r in w.rows[copied:] if r.get("error")]
    reason = incomplete_reason(state, interrupted)
    ok = not state.errors and not failed_rows and not interrupted and reason is None
    t = state.times
    state.extra.update(pipeline_summary(state.configs))
    state.extra.update(run_metrics(state, w))
    summary = build_summary(
        w.rows,
        transport=run_transport(state, w.rows),
        experiment=state.manifest.name,
        run_id=w.run_id,
        status="interrupted" if interrupted else ("ok" if ok else "failed"),
        incomplete={"reason": reason} if reason else None,
        resumed_from=getattr(w, "resumed_from", None),
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
    try:  # like scoring: the rate-fidelity table must never lose the run's own results
        codecs = codec_summary(w.rows, summary, (state.manifest.partitioner or {}).get("params"))
    except Exception as exc:
        log.warning("rate-fidelity summary failed: %s", exc)
        summary.setdefault("warnings", []).append(f"rate-fidelity summary failed: {exc}")
        codecs = None
    if codecs:
        summary["codecs"] = codecs
    if state.eval_ctx is not None and summary["splits"] and getattr(w, "failure", None) is None:
        summary["partitioners"] = score_partitioners(state, summary, w.dir, w.rows)
        score_energy(summary)
        # on a codec sweep: the noise of the per-split oracle (the run's transport, which
        # split-only partitioners are scored on) and of the pairs' (split-codec's)
        label = (summary.get("split_transport") or {}).get("label")
        summary["measurement_noise"] = measurement_noise(rows_of_transport(w.rows, label))
        if codecs and summary["measurement_noise"] is not None:
            summary["measurement_noise"]["pairs"] = pair_noise(w.rows, codecs["pairs"],
                                                               codecs["floor"])
    adaptive = score_adaptive(state, summary, w.dir, w.rows)
    if adaptive is not None:
        summary["adaptive"] = adaptive
    add_budget(state, summary, w.dir, w.rows)
    if write_summary(w, summary):
        draw_plots(summary, w.dir)
    return RunResult(run_dir=w.dir, summary=summary, ok=ok and summary["status"] == "ok",
                     errors=list(state.errors))


def add_budget(state: RunState, summary: dict, run_dir: Path, rows: list[dict]) -> None:
    """``latency_budget`` (do the parts add up to e2e?) and ``warmup`` (what was not
    recorded) into the summary; a budget that cannot be read is a warning."""
    rounds = int((state.manifest.run or {}).get("warmup", 2) or 0)
    configs = len((summary.get("pipeline") or {}).get("configs") or [])
    summary["warmup"] = warmup_count(rounds, len(summary.get("splits") or []), configs)
    try:
        write_holds(state, run_dir)
        summary["latency_budget"] = run_budget(run_dir, rows)
    except Exception as exc:  # the run's own results first
        log.warning("latency budget not read: %s", exc)
        summary.setdefault("warnings", []).append(f"latency budget not read: {exc}")


def write_holds(state: RunState, run_dir: Path) -> Path | None:
    """``holds.csv``: the lab pacer's holds of the run's hosts over its stages' times, one
    row per instance on a held host (:data:`experiment_design.protocol.HOLD_COLUMNS`), or
    None where the run has no stages or its hosts are not paced."""
    if state.facts.holds is None:
        return None
    times = [float(v) for r in complete_rows(run_dir / STAGES_FILE)
             for k in ("t_arrive_ms", "t_start_ms", "t_sent_ms")
             if (v := r.get(k)) not in (None, "")]
    if not times:
        return None
    on: dict[str, list[str]] = {}
    for inst in state.manifest.participant_instances:
        on.setdefault(str(inst.get("device")), []).append(str(inst.get("name")))
    out = []
    for h in state.facts.holds(min(times) - 1e3, max(times) + 1e3):
        if h.get("host") is None:
            out.append({"instance": "", "host": "", "t_stop_ms": h.get("t_stop_ms")})
        out += [{**h, "instance": name} for name in on.get(str(h.get("host")), [])]
    return write_holds_csv(run_dir, out)


def run_metrics(state: RunState, w) -> dict:
    """summary.json ``metrics``, ``machine_drift`` and ``model_memory`` from the
    participants' samplers and the model profile, and ``metrics.csv``; a failure here is a
    warning, never the run's results lost."""
    try:
        profile = next((i.profile for i in state.infos.values() if i and i.profile), None)
        devices = {i.get("name"): i.get("device") for i in
                   state.manifest.participant_instances or []}
        # a resumed run's copied rows were measured by the run it continues, not sampled here
        copied = int((getattr(w, "resumed_from", None) or {}).get("rows") or 0)
        out = metrics_summary(state.metrics, w.rows[copied:], profile, devices)
        write_metrics(w.dir, state.metrics)
    except Exception as exc:
        log.warning("metrics summary failed: %s", exc)
        return {"warnings": [*state.extra.get("warnings", []),
                             f"metrics summary failed: {exc}"]}
    return out


def run_transport(state: RunState, rows: list[dict]) -> str | None:
    """The label of the manifest's transport (what the run sends with unless a partitioner
    or a sweep says otherwise) where ``rows`` were sent with several transports, else None
    (the label is needed only then, and the codec module imports torch)."""
    if len({r.get("transport") for r in rows if not r.get("error")} - {"", None}) < 2:
        return None

    try:
        return CodecConfig.from_dict(dict(state.manifest.transport or {})).label
    except (TracrError, TypeError, ValueError):
        return None


def draw_plots(summary: dict, run_dir: Path) -> None:
    """The run's figures (every kind that applies: :mod:`app_api.results.figures`), then
    ``report.html``, after the run, off its timed path. A figure or a report that fails is
    logged, never raised: they must never lose a run."""
    try:  # matplotlib loads inside draw_kinds, once there is something to draw
        draw_kinds(summary, Path(run_dir))
    except Exception as exc:
        log.warning("plots not drawn: %s", exc)
    try:
        write_report(Path(run_dir), summary)
    except Exception as exc:
        log.warning("report.html not written: %s", exc)


def write_summary(writer, summary: dict) -> bool:
    """Write ``summary.json``; if it does not fit (a full disk), a small one that still says
    what happened. True when the full one was written."""
    try:
        writer.write_json("summary.json", summary)
        return True
    except ResultsWriteError as exc:
        summary["errors"].append(str(exc))
        summary["status"] = "failed" if summary["status"] == "ok" else summary["status"]
        summary["incomplete"] = summary.get("incomplete") or {"reason": exc.reason}
    small = {k: summary.get(k) for k in SMALL_SUMMARY}
    small["errors"] = [e[:500] for e in summary["errors"][-5:]]
    try:
        writer.write_json("summary.json", small)
    except ResultsWriteError as exc:
        log.error("summary.json not written: %s", exc)
    return False


#: the keys of the small summary.json written when the full one does not fit
SMALL_SUMMARY = ("experiment", "run_id", "status", "incomplete", "resumed_from", "inferences",
                 "failed", "best_split", "wall_s", "model")


def score_adaptive(state: RunState, summary: dict, run_dir: Path,
                   rows: list[dict]) -> dict | None:
    """The adaptive partitioner's block (:func:`app_api.results.adaptive.adaptive_summary`:
    ``adaptive.csv``, the hindsight scores), None when the run has none; never raises."""
    try:
        return adaptive_summary(summary, rows, run_dir,
                                (state.manifest.evaluate or {}).get("hindsight"),
                                link_timeline_of(state, run_dir, rows))
    except Exception as exc:  # scoring must never lose the run's own results
        log.warning("adaptive scoring failed: %s", exc)
        summary.setdefault("warnings", []).append(f"adaptive scoring failed: {exc}")
        return None


def link_timeline_of(state: RunState, run_dir: Path, rows: list[dict]) -> list[dict] | None:
    """The edge's lab link over the run (its egress: configured rate against wall time,
    and the trace's clock), or None off the lab. Every link's rows go to ``link.csv``."""
    times = [float(r["t_unix"]) for r in rows if r.get("t_unix") not in (None, "")]
    if state.facts.timeline is None or not times:
        return None
    try:
        entries = state.facts.timeline(min(times) - 1.0, max(times) + 1.0)
    except Exception as exc:  # the run's own results first: scored without the link
        log.warning("link timeline not read: %s", exc)
        return None
    if not entries:
        return None

    write_link_csv(run_dir, entries)
    head = next((i for i in state.manifest.participant_instances
                 if i.get("name") == (summary_head(state) or "")), None)
    device = (head or {}).get("device")
    mine = [e for e in entries if e.get("link") == device and e.get("dir") == "up"]
    return mine or None


def summary_head(state: RunState) -> str | None:
    """The instance whose partitioner decided (the head), if any."""
    return next((i for i, p in state.partitioners.items() if p), None)


def score_partitioners(state: RunState, summary: dict, run_dir: Path,
                       rows: list[dict] | None = None) -> dict | None:
    """Score the manifest's ``evaluate.partitioners`` against this sweep (``rows``: its
    inference rows, whose per-pair samples tell a pair-choosing partitioner's ties)."""
    m = state.manifest
    try:
        rates = [parse_rate(bw) for bw in (m.network or {}).get("bandwidths") or []]
        return evaluate_run(m.evaluate["partitioners"], state.eval_ctx, summary["splits"],
                            run_dir, rates, pairs=(summary.get("codecs") or {}).get("pairs"),
                            sweep=(m.partitioner or {}).get("params"),
                            best_set=(summary.get("best_set") or {}).get("splits"),
                            pair_samples=pair_samples(rows or []),
                            split_transport=(summary.get("split_transport") or {}).get("label"))
    except Exception as exc:  # scoring must never lose the run's own results
        log.warning("partitioner evaluation failed: %s", exc)
        summary.setdefault("warnings", []).append(f"partitioner evaluation failed: {exc}")
        return None
