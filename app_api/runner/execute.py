"""Carrying out a :class:`~app_api.runner.plan.RunPlan`: the one place that runs each kind.

A plain run goes over the link as it is (:func:`run_plain`); a shaped run over a
lab link shaped to its rate, the old shaping put back after (:func:`run_shaped`);
a bandwidth sweep is one shaped run per rate (:mod:`app_api.runner.bandwidths`).

Where the results go is settled here, before any device is touched: ``--out``
must be a new (or empty) directory, never a previous run's; a resumed run gets a
fresh directory seeded with the rows of the run it continues.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from app_api.results import claim_run_dir, prepare_resume
from app_api.runner import labcheck, shaping
from app_api.runner.bandwidths import run_bandwidths
from app_api.runner.labfacts import lab_facts
from app_api.runner.llm import check_memory
from app_api.runner.observer import RunResult, run_experiment
from app_api.runner.plan import PLAIN, SHAPED, SWEEP, PlannedRun, RunPlan
from experiment_design.errors import TracrError


def execute(plan: RunPlan, out_dir: str | os.PathLike | None = None, progress: bool = True,
            say: Callable[[str], None] = lambda m: None) -> RunResult:
    """Run ``plan``; a sweep's result is its group (directory, ``group.json`` as summary)."""
    if plan.kind not in (PLAIN, SHAPED, SWEEP):
        raise ValueError(f"unknown plan kind {plan.kind!r}")
    labcheck.check_lab(plan.manifest)  # the stated lab, before any device is touched
    check_memory(plan.manifest)  # a token pipeline's stages within the lab's memory caps
    resume = plan.runs[0].resume_from if plan.kind != SWEEP else None
    if resume is not None:
        out_dir = prepare_resume(resume, plan.manifest.name, out_dir)
        say(f"resuming {resume}: its measurements are kept, the rest goes to {out_dir}")
    elif out_dir is not None:
        claim_run_dir(out_dir)  # refused (exit 2) if it holds a previous run
    t0 = time.time()
    try:
        if plan.kind == PLAIN:
            result = run_plain(plan.runs[0], out_dir=out_dir, progress=progress)
        elif plan.kind == SHAPED:
            result = run_shaped(plan.runs[0], out_dir=out_dir, progress=progress, say=say)
        else:
            result = run_bandwidths(plan, out_dir=out_dir, progress=progress, say=say)
    except TracrError as exc:  # a deploy or set-up that failed: was the lab's link the cause?
        dead = labcheck.lab_health_errors(plan.manifest)
        if dead:
            raise TracrError(f"{exc}\n" + "; ".join(dead),
                             hint="sudo tracr lab down, then tracr lab up again") from exc
        raise
    labcheck.record_link(plan.manifest, result.run_dir, t0, time.time())
    if not result.ok:  # a lost participant: name a dead lab helper as the cause
        for reason in labcheck.lab_health_errors(plan.manifest):
            result.errors.append(reason)
    return result


def run_plain(run: PlannedRun, out_dir: str | os.PathLike | None = None,
              progress: bool = True) -> RunResult:
    """One run over the link as it is (the lab's report is recorded when on the lab)."""
    return run_experiment(run.manifest, out_dir=out_dir, progress=progress,
                          facts=lab_facts(run.manifest))


def run_shaped(run: PlannedRun, out_dir: str | os.PathLike | None = None,
               progress: bool = True, say: Callable[[str], None] = lambda m: None) -> RunResult:
    """One run over a lab link shaped to ``run.bandwidth``; the old shaping is put back."""
    shaping.check_lab_participants(run.manifest)
    with shaping.shaped(run.bandwidth, run.delay_ms, run.link, say=say) as report:
        return run_experiment(run.manifest, out_dir=out_dir, progress=progress,
                              facts=lab_facts(run.manifest, link=report))
