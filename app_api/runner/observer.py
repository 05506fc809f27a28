"""The observer: runs one manifest through its phases, always tearing down.

The phases, each in its own module over one :class:`~app_api.runner.state.RunState`:
deploy (:mod:`.deploy`), wire (:mod:`.wire`), warm-up (:mod:`.warmup`), play
(:mod:`.play`), teardown (:mod:`.teardown`) and gather (:mod:`.gather`).

From the first launch to the end of teardown one thread writes the observer's
heartbeat to every participant (:class:`~app_api.runner.pulse.Pulse`). Every
wait checks :meth:`RunState.check`, so the run ends by itself when a participant
is lost or ``run.timeout_s`` is reached (exit 1, rows kept, the reason in
``errors`` and ``incomplete_reason``), and within seconds of Ctrl-C (exit 130);
a second Ctrl-C kills every participant and exits at once.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from app_api.launch import ParticipantHandle, ParticipantLost
from app_api.results import RunWriter
from app_api.runner.deploy import deploy
from app_api.runner.facts import LabFacts
from app_api.runner.gather import RunResult, gather
from app_api.runner.play import play
from app_api.runner.progress import ProgressView
from app_api.runner.pulse import Pulse
from app_api.runner.state import Interrupted, RunInterrupted, RunState, RunTimeout
from app_api.runner.teardown import teardown
from app_api.runner.warmup import warmup
from app_api.runner.wire import wire
from experiment_design.errors import TracrError

__all__ = ["Interrupted", "Observer", "RunResult", "run_experiment"]


class Observer:
    """Runs one manifest. Use :func:`run_experiment`."""

    def __init__(self, manifest: Any, out_dir: str | os.PathLike | None = None,
                 progress: bool = True, facts: LabFacts | None = None) -> None:
        self.state = RunState(manifest=manifest,
                              writer=RunWriter(manifest.name, out_dir),
                              view=ProgressView(progress, title=manifest.name),
                              facts=facts or LabFacts())
        lab_link = self.state.facts.link_report()
        if lab_link:
            # the lab link, as configured and as measured when it was (re)shaped
            self.state.extra["network"] = {"lab": lab_link}
        if self.state.facts.lab_check is not None:
            # the lab the manifest states against the lab that is up (app_api.runner.labcheck)
            self.state.extra["lab_check"] = dict(self.state.facts.lab_check)

    @property
    def handles(self) -> dict[str, ParticipantHandle]:
        """The launched participants, by instance name."""
        return self.state.handles

    def _timed(self, phase: str, fn: Callable[[RunState], object], key: str | None) -> None:
        self.state.phase = phase
        t0 = time.perf_counter()
        fn(self.state)
        if key:
            self.state.times[key] = time.perf_counter() - t0

    def run(self) -> RunResult:
        """Deploy, wire, warm up, play, tear down (always), gather the results."""
        s = self.state
        s.writer.write_text("manifest.yaml", s.manifest.to_yaml())
        s.writer.write_json("overrides.json", list(s.manifest.overrides or []))
        interrupted = False
        fatal: BaseException | None = None
        old = _install_signals(s)
        t0 = time.perf_counter()
        if s.timeout_s:
            s.deadline = time.monotonic() + s.timeout_s
        pulse = Pulse(s.participants).start()
        try:
            self._timed("deploy", deploy, None)
            self._timed("deploy", wire, None)
            s.times["deploy_s"] = time.perf_counter() - t0
            self._timed("warmup", warmup, "warmup_s")
            s.view.phase("running the playbook")
            self._timed("play", play, "wall_s")
            why = s.ending()
            if s.stop_requested:
                raise Interrupted("signal")
            if why:
                raise RunTimeout(why)
        except (KeyboardInterrupt, Interrupted):
            interrupted = True
            s.request_stop()  # teardown hurries
            s.end("interrupted")
        except (ParticipantLost, RunTimeout) as exc:
            # the run ends by itself: what was measured is kept, the summary says why
            s.end(str(exc))
            if isinstance(exc, ParticipantLost) and exc.hint:
                s.errors.append(exc.hint)  # with the end of the lost one's stderr
        except TracrError as exc:
            s.errors.append(str(exc) + (f" ({exc.hint})" if exc.hint else ""))
            if not s.writer.rows:
                fatal = exc  # set-up problem (bad config, unreachable device): a user error
        except Exception as exc:
            s.errors.append(f"{type(exc).__name__}: {exc}")
            fatal = exc
        finally:
            s.phase = "teardown"
            s.view.stop()
            t3 = time.perf_counter()
            try:
                teardown(s)
            except Exception as exc:  # the measured rows and the summary are kept regardless
                s.errors.append(f"teardown: {type(exc).__name__}: {exc}")
            finally:
                pulse.stop()
                s.times["teardown_s"] = time.perf_counter() - t3
                _restore_signals(old)
        result = gather(s, interrupted=interrupted)
        if fatal is not None:
            raise fatal
        if interrupted:
            raise RunInterrupted(result.run_dir)
        return result


def _install_signals(state: RunState):
    """SIGINT/SIGTERM set the stop flag, which every wait looks at within a slice (no rpyc
    exchange is cut in half); a second one kills every participant and exits at once."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        if state.stop_requested:
            for h in state.participants():
                h.kill()
            os.write(2, b"interrupted again: participants killed\n")
            os._exit(130)
        state.request_stop()

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def _restore_signals(old) -> None:
    if old and threading.current_thread() is threading.main_thread():
        for sig, h in old.items():
            signal.signal(sig, h)


def run_experiment(manifest: Any, out_dir: str | os.PathLike | None = None,
                   progress: bool = True, facts: LabFacts | None = None) -> RunResult:
    """Run a loaded :class:`app_api.manifest.Manifest` and return its :class:`RunResult`.

    ``facts``: what the lab knows about the hosts (its link report, recorded in
    ``summary.json`` under ``network.lab``, and CPU quotas), gathered by the caller
    (:func:`app_api.runner.labfacts.lab_facts`); None for none.
    """
    return Observer(manifest, out_dir=out_dir, progress=progress, facts=facts).run()
