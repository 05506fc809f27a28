"""What one run knows while it runs: the participants, what they reported, what went wrong.

Each phase of the runner (deploy, wire, warm-up, play, gather, teardown) reads and
fills one :class:`RunState`; none keeps state of its own between phases.

It also says when the run must stop waiting (:meth:`RunState.check`, the guard of
every control call and of every phase's wait): a stop request (Ctrl-C, SIGTERM),
``run.timeout_s`` reached, a participant silent for ``run.liveness_timeout_s``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from app_api.launch import ParticipantHandle, ParticipantLost
from app_api.launch.base import STARTUP_TIMEOUT_S
from app_api.results.metrics import MetricsLog
from app_api.runner.client import ParticipantClient, lost_hint
from app_api.runner.facts import LabFacts
from app_api.runner.progress import ProgressView
from experiment_design.errors import TracrError
from experiment_design.protocol import LIVENESS_TIMEOUT_S, SetupInfo

T = TypeVar("T")
R = TypeVar("R")

#: after a stop request or the run's timeout the playbook may drain rows this long
STOP_GRACE_S = 1.5


class Interrupted(BaseException):
    """Ctrl-C or SIGTERM: every wait stops, teardown and gather run, exit 130."""


class RunInterrupted(KeyboardInterrupt):
    """Raised by a run that Ctrl-C ended once its partial results are written; ``run_dir``
    holds them (``tracr experiment run NAME --resume RUN_DIR`` continues it)."""

    def __init__(self, run_dir) -> None:
        super().__init__(str(run_dir))
        self.run_dir = run_dir


class RunTimeout(TracrError):
    """``run.timeout_s`` reached: the run ends with what it measured (exit 1)."""

    exit_code = 1


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
    #: the run's data-path secret: the observer derives each link's key from it
    #: (``transport.auth.link_key``) and hands a participant only its own links' keys
    data_secret: bytes = field(default_factory=lambda: os.urandom(32), repr=False)
    partitioners: dict[str, dict | None] = field(default_factory=dict)
    #: measured configurations of a chain (``configs.csv`` rows with their ``stages``)
    configs: list[dict] = field(default_factory=list)
    #: the participants' samplers' samples and facts (``metrics.csv``, summary ``metrics``)
    metrics: MetricsLog = field(default_factory=MetricsLog)
    #: start-up measurements to score the manifest's ``evaluate.partitioners`` with
    eval_ctx: dict | None = None
    #: the start-up profiles partitioners decided from, by participant (``profiles.json``)
    profiles: dict[str, dict] = field(default_factory=dict)
    phase: str = "init"
    stop_requested: bool = False
    #: monotonic time of the first stop request
    stop_at: float | None = None
    #: monotonic time ``run.timeout_s`` is reached (None: no limit)
    deadline: float | None = None
    #: why the run ended before its playbook did (also in ``errors``); gather marks the
    #: summary incomplete with it
    incomplete_reason: str | None = None
    _owning: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # -- the manifest's bounds ------------------------------------------------------------------
    @property
    def liveness_s(self) -> float:
        """``run.liveness_timeout_s``: a participant silent this long is lost."""
        return float((self.manifest.run or {}).get("liveness_timeout_s") or LIVENESS_TIMEOUT_S)

    @property
    def startup_s(self) -> float:
        """``run.startup_timeout_s``: the cap on a start-up and on each long call."""
        return float((self.manifest.run or {}).get("startup_timeout_s") or STARTUP_TIMEOUT_S)

    @property
    def timeout_s(self) -> float | None:
        """``run.timeout_s``: the whole run's limit, or None."""
        t = (self.manifest.run or {}).get("timeout_s")
        return float(t) if t else None

    def adopt(self, instance: str, handle: ParticipantHandle) -> None:
        """Take ownership of a launched participant (thread-safe: launches run in parallel)."""
        with self._owning:
            self.owned.enter_context(handle)
            self.handles[instance] = handle

    def participants(self) -> list[ParticipantHandle]:
        """A snapshot of the handles (safe while launches still add to them)."""
        with self._owning:
            return list(self.handles.values())

    def client(self, instance: str, watch_all: bool = True) -> ParticipantClient:
        """The typed control client of ``instance`` (errors name it and its host); its
        calls stop waiting on :meth:`check` (``watch_all``) or only on the run's own
        limits and ``instance``'s liveness."""
        return ParticipantClient(
            instance, self.handles[instance], liveness_s=self.liveness_s,
            long_call_s=self.startup_s, guard=self.check if watch_all else self.check_run,
        )

    # -- when to stop waiting --------------------------------------------------------------------
    def request_stop(self) -> None:
        """A stop request (the signal handler's): every wait ends within a slice."""
        if not self.stop_requested:
            self.stop_at = time.monotonic()
        self.stop_requested = True

    def ending(self) -> str | None:
        """Why the run must end now (a stop request, ``run.timeout_s``), or None."""
        if self.stop_requested:
            return "interrupted"
        if self.deadline is not None and time.monotonic() > self.deadline:
            return f"run.timeout_s ({self.timeout_s:g} s) reached"
        return None

    def end(self, reason: str) -> None:
        """Record why the run ends early (once in ``errors``; the first is the reason)."""
        if reason not in self.errors:
            self.errors.append(reason)
        if self.incomplete_reason is None:
            self.incomplete_reason = reason

    def check_run(self) -> None:
        """Raise :class:`Interrupted` or :class:`RunTimeout` when the run must end; the
        playbook is given :data:`STOP_GRACE_S` to cancel its tasks and drain their rows."""
        why = self.ending()
        if why is None:
            return
        if self.phase == "play":
            since = self.stop_at if self.stop_requested else self.deadline
            if since is not None and time.monotonic() - since < STOP_GRACE_S:
                return
        if self.stop_requested:
            raise Interrupted(why)
        raise RunTimeout(why)

    def check(self) -> None:
        """:meth:`check_run`, and :class:`ParticipantLost` for any participant that has
        started and is silent for the liveness timeout (named with its host)."""
        self.check_run()
        limit = self.liveness_s
        for inst, h in list(self.handles.items()):
            if h.conn is not None and h.silent_for() > limit:
                raise ParticipantLost(
                    f"participant {inst} on {h.host_label} silent for {limit:.0f} s (lost)",
                    hint=lost_hint(h),
                )


def parallel(fn: Callable[[T], R], items: list[T],
             check: Callable[[], None] | None = None) -> list[R | None]:
    """``fn`` over ``items`` on threads (one per participant); the first error is re-raised
    after every call has ended, so no participant is left half set up. The wait looks at
    ``check`` every 0.1 s and stops waiting when it raises (the threads are daemons whose
    calls end when teardown stops their participants)."""
    if len(items) <= 1 and check is None:
        return [fn(i) for i in items]
    out: list[R | None] = [None] * len(items)
    errs: list[BaseException | None] = [None] * len(items)

    def run(k: int, item: T) -> None:
        try:
            out[k] = fn(item)
        except BaseException as exc:  # collected, the first re-raised below
            errs[k] = exc

    threads = [threading.Thread(target=run, args=(k, i), daemon=True, name="parallel")
               for k, i in enumerate(items)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.1)
            if check is not None:
                check()
    first = next((e for e in errs if e is not None), None)
    if first is not None:
        raise first
    return out
