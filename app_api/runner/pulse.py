"""The observer's heartbeat: one thread writes a line to every participant's stdin.

From the first launch to the end of teardown, every ``HEARTBEAT_S`` seconds,
whatever phase the run is in (a participant that gets no call while its partner
profiles for minutes is not idle: the observer is alive). The participant's idle
watchdog is fed by these lines, and exits when they stop for its idle timeout.
Writes never block (:meth:`~app_api.launch.ParticipantHandle.beat`), so a stopped
participant does not hold up the others' heartbeats.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType

from app_api.launch import ParticipantHandle
from experiment_design.protocol import HEARTBEAT_S


class Pulse:
    """Beats the handles ``handles()`` returns, on a daemon thread, while in its ``with``.

    >>> with Pulse(state.participants):
    ...     run_the_phases()
    """

    def __init__(self, handles: Callable[[], list[ParticipantHandle]],
                 every_s: float = HEARTBEAT_S) -> None:
        self.handles = handles
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="observer-pulse")

    def _run(self) -> None:
        while not self._stop.is_set():
            for h in self.handles():
                h.beat()
            self._stop.wait(self.every_s)

    def start(self) -> Pulse:
        """Start beating."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating (the participants then exit after their idle timeout, if alive)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1)

    def __enter__(self) -> Pulse:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
