"""Carrying out a :class:`~app_api.runner.plan.RunPlan`: the one place that runs each kind."""

from __future__ import annotations

import os
from collections.abc import Callable

from app_api.runner import network
from app_api.runner.bandwidths import run_bandwidths
from app_api.runner.observer import RunResult
from app_api.runner.plan import PLAIN, SHAPED, SWEEP, RunPlan


def execute(plan: RunPlan, out_dir: str | os.PathLike | None = None, progress: bool = True,
            say: Callable[[str], None] = lambda m: None) -> RunResult:
    """Run ``plan``; a sweep's result is its group (directory, ``group.json`` as summary)."""
    if plan.kind == PLAIN:
        return network.run_plain(plan.runs[0], out_dir=out_dir, progress=progress)
    if plan.kind == SHAPED:
        return network.run_shaped(plan.runs[0], out_dir=out_dir, progress=progress, say=say)
    if plan.kind == SWEEP:
        return run_bandwidths(plan, out_dir=out_dir, progress=progress, say=say)
    raise ValueError(f"unknown plan kind {plan.kind!r}")
