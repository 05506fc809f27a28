"""Teardown phase: shut every participant down and check that nothing is left behind.

Bounded whatever the participants do: only a participant that still heartbeats is
asked to shut down (its reply awaited ~2 s at most), and after a stop request
(Ctrl-C) nobody is asked: every participant is stopped at once (process groups
SIGKILLed after a short grace, SSH sessions closed).
"""

from __future__ import annotations

from app_api.launch import ParticipantHandle
from app_api.runner.state import RunState, parallel
from experiment_design.errors import TracrError

#: how long a participant may take to end by itself once asked (then it is killed)
STOP_S = 10.0
#: the same after a stop request: Ctrl-C ends the run within seconds
STOP_NOW_S = 1.0
SHUTDOWN_REPLY_S = 2.0


def teardown(state: RunState) -> None:
    """Ask each live participant to shut down, stop them all, and record any leftover."""
    hurry = state.stop_requested

    def stop(item: tuple[str, ParticipantHandle]) -> None:
        inst, h = item
        if not hurry and h.conn is not None and h.alive() and h.beating():
            try:  # the polite goodbye; a participant that does not answer is stopped anyway
                h_client = state.client(inst, watch_all=False)
                h_client.guard = None  # teardown runs after the run's limits have fired
                h_client.shutdown(timeout=SHUTDOWN_REPLY_S)
            except Exception:  # already gone: stop() below cleans up
                pass
        h.stop(timeout=STOP_NOW_S if hurry else STOP_S)

    with state.owned:  # stopped in parallel (fast); the stack closes any the pool missed
        parallel(stop, list(state.handles.items()))

    def check(item: tuple[str, ParticipantHandle]) -> list[str]:
        inst, h = item
        try:
            return [f"{inst}: {x}" for x in h.leftovers()]
        except TracrError as exc:  # device unreachable (its link is down): say so, keep results
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            unchecked.append(f"{inst} ({first})")
            return []

    unchecked: list[str] = []
    left = [x for found in parallel(check, list(state.handles.items())) for x in found or []]
    if left:
        state.errors.append("left behind after teardown: " + ", ".join(left))
    if unchecked:
        state.errors.append(
            "could not check for leftovers on " + ", ".join(unchecked)
            + "; a participant cut off from the observer exits by itself after its idle timeout"
        )  # fmt: skip
