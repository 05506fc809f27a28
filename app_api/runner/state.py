"""What one run knows while it runs: the participants, what they reported, what went wrong.

Each phase of the runner (deploy, wire, warm-up, play, gather, teardown) reads and
fills one :class:`RunState`; none keeps state of its own between phases.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from app_api.launch import ParticipantHandle
from app_api.runner.client import ParticipantClient
from app_api.runner.facts import LabFacts
from app_api.runner.progress import ProgressView
from experiment_design.protocol import SetupInfo

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class RunState:
    """The shared state of one run (see the module docstring)."""

    manifest: Any
    writer: Any
    view: ProgressView
    facts: LabFacts = field(default_factory=LabFacts)
    handles: dict[str, ParticipantHandle] = field(default_factory=dict)
    #: owns every launched participant: teardown's one exit path closes them all
    owned: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    roles: dict[str, str] = field(default_factory=dict)
    envs: dict[str, dict] = field(default_factory=dict)
    infos: dict[str, SetupInfo] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)
    #: extra top-level keys of summary.json (network, warnings, partitioner)
    extra: dict[str, Any] = field(default_factory=dict)
    pairs: list[tuple[str, str]] = field(default_factory=list)
    partitioners: dict[str, dict | None] = field(default_factory=dict)
    #: start-up measurements to score the manifest's ``evaluate.partitioners`` with
    eval_ctx: dict | None = None
    phase: str = "init"
    stop_requested: bool = False
    _owning: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def adopt(self, instance: str, handle: ParticipantHandle) -> None:
        """Take ownership of a launched participant (thread-safe: launches run in parallel)."""
        with self._owning:
            self.owned.enter_context(handle)
            self.handles[instance] = handle

    def client(self, instance: str) -> ParticipantClient:
        """The typed control client of ``instance`` (errors name it and its host)."""
        return ParticipantClient(instance, self.handles[instance])


def parallel(fn: Callable[[T], R], items: list[T]) -> list[R | None]:
    """``fn`` over ``items`` on threads (one per participant); the first error is re-raised
    after every call has ended, so no participant is left half set up."""
    if len(items) <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(max_workers=len(items)) as ex:
        futs = [ex.submit(fn, i) for i in items]
        errs: list[BaseException] = []
        out: list[R | None] = []
        for f in futs:
            try:
                out.append(f.result())
            except BaseException as exc:  # collect all, raise the first
                errs.append(exc)
                out.append(None)
        if errs:
            raise errs[0]
        return out
