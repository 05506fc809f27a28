"""The observer side of a run: launchers, the experiment runner, progress display."""

from __future__ import annotations

from app_api.runner.launcher import Launcher, ParticipantHandle, ParticipantSpec, launcher_for
from app_api.runner.observer import RunResult, run_experiment

__all__ = ["Launcher", "ParticipantHandle", "ParticipantSpec", "RunResult", "launcher_for",
           "run_experiment"]
