"""Teardown phase: shut every participant down and check that nothing is left behind."""

from __future__ import annotations

from app_api.launch import ParticipantHandle
from app_api.runner.state import RunState, parallel


def teardown(state: RunState) -> None:
    """Ask each live participant to shut down, stop them all, and record any leftover."""
    for inst, h in list(state.handles.items()):
        if h.alive() and h.conn is not None:
            try:
                state.client(inst).shutdown()
            except Exception:  # already gone: stop() below cleans up
                pass

    def stop(h: ParticipantHandle) -> None:
        h.stop(timeout=10.0)

    with state.owned:  # stopped in parallel (fast); the stack closes any the pool missed
        parallel(stop, list(state.handles.values()))
    left = [f"{i}: {x}" for i, h in state.handles.items() for x in h.leftovers()]
    if left:
        state.errors.append("left behind after teardown: " + ", ".join(left))
