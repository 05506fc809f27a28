"""The observer side of a run: the experiment runner and its progress display.

Participants are started by :mod:`app_api.launch`.
"""

from __future__ import annotations

from app_api.runner.observer import RunResult, run_experiment

__all__ = ["RunResult", "run_experiment"]
