"""What every launcher shares: the spec of a participant, its launched handle, the launcher.

A :class:`Launcher` turns a :class:`ParticipantSpec` into a running participant
process and returns a :class:`ParticipantHandle` holding its authenticated rpyc
control connection. The handle is the one owner of everything the launch made
(the process, the SSH session and its tunnel, the temp directory) and a context
manager: leaving the ``with`` block, or :meth:`ParticipantHandle.close`, unwinds
them in order, the way rpyc's ``DeployedServer`` does::

    with launcher_for("jetson").start(spec) as handle:
        handle.conn.root.hello()
    assert handle.leftovers() == []

The siblings over this base are :mod:`app_api.launch.local` (the built-in
``localhost``) and :mod:`app_api.launch.ssh` (paired devices).

Liveness goes over the participant's stdio, both ways, for its whole life: the
handle reads everything the participant prints (its heartbeats included) and
records when anything last arrived (:meth:`ParticipantHandle.silent_for`), and
:meth:`ParticipantHandle.beat` writes the observer's heartbeat to its stdin
without ever blocking (the runner calls it from one thread for all handles).
Start-up waits are bounded the same way: no heartbeat for the spec's
``liveness_s``, or no READY line within ``startup_s`` in all, ends the launch.
"""

from __future__ import annotations

import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.protocol import ALIVE_LINE, HEARTBEAT_S, LIVENESS_TIMEOUT_S

#: default cap on a whole start-up (ship, venv, import torch, build the service)
STARTUP_TIMEOUT_S = 600.0
_BEAT = (ALIVE_LINE + "\n").encode()


class ParticipantLost(TracrError):
    """A participant died, went silent for its liveness timeout, or lost its control
    connection; the run ends by itself (exit 1) and keeps what was measured."""

    exit_code = 1


@dataclass
class ParticipantSpec:
    """What to start: one participant instance of a role on a device."""

    instance: str
    role: str
    device: str
    threads: int | None
    secret: bytes  # control-channel secret (per run, per participant)
    #: silent (no heartbeat, no output) this long: lost; also the participant's idle timeout
    liveness_s: float = LIVENESS_TIMEOUT_S
    #: the whole start-up (READY line) may take this long, heartbeats flowing
    startup_s: float = STARTUP_TIMEOUT_S


class ParticipantHandle(ABC):
    """A launched participant as the observer sees it; owns what its launch created."""

    instance: str
    device: str
    host_label: str
    conn: Any  # rpyc.Connection, authenticated
    data_host: str  # address partners use to reach this participant's data server
    pid: int | None = None
    #: monotonic time anything (a heartbeat, a log line) last arrived from the participant
    last_heard: float = 0.0
    _beat_fd: int | None = None
    _beat_lock: threading.Lock | None = None

    @abstractmethod
    def alive(self) -> bool:
        """True while the participant process runs."""

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` began (a launcher sets ``_stopped``): waits end at once."""
        return bool(getattr(self, "_stopped", False))

    def ended(self) -> str:
        """How a participant that is no longer :meth:`alive` ended, for messages
        (``died (pid N)``; a launcher that can tell a lost connection says so)."""
        return f"died (pid {self.pid})" if self.pid else "died"

    # -- liveness --------------------------------------------------------------------------
    def heard(self) -> None:
        """Something arrived from the participant: it is alive."""
        self.last_heard = time.monotonic()

    def silent_for(self) -> float:
        """Seconds since anything arrived from the participant (0 before it was launched)."""
        return time.monotonic() - self.last_heard if self.last_heard else 0.0

    def beating(self) -> bool:
        """True while the participant's heartbeats arrive on time (it is not stopped)."""
        return self.silent_for() < 2.5 * HEARTBEAT_S

    def open_beats(self, fd: int) -> None:
        """From now on :meth:`beat` writes to ``fd`` (the participant's stdin, after the
        secret); it is made non-blocking so a stopped participant never blocks the writer."""
        os.set_blocking(fd, False)
        self._beat_lock = self._beat_lock or threading.Lock()
        with self._beat_lock:
            self._beat_fd = fd

    def close_beats(self) -> None:
        """No more heartbeats (before the stream under them is closed: its fd may be reused)."""
        if self._beat_lock is None:
            return
        with self._beat_lock:
            self._beat_fd = None

    def beat(self) -> None:
        """Write the observer's heartbeat line to the participant's stdin; never blocks
        (a full pipe, a participant that is gone: the beat is skipped)."""
        if self._beat_lock is None:
            return
        with self._beat_lock:
            if self._beat_fd is None:
                return
            try:
                os.write(self._beat_fd, _BEAT)  # 12 bytes: one atomic pipe write
            except OSError:  # BlockingIOError (pipe full) or the pipe is gone
                pass

    def kill(self) -> None:
        """End at once what the launch started, waiting for nothing (a second Ctrl-C)."""
        self.close_beats()

    @abstractmethod
    def stop(self, timeout: float = 10.0) -> None:
        """Stop the participant; idempotent; afterwards its process and temp dir are gone."""

    @abstractmethod
    def leftovers(self) -> list[str]:
        """Processes or directories still present after :meth:`stop` (empty if clean)."""

    def stderr_tail(self, n: int = 20) -> str:
        """The last lines the participant wrote to stderr, when the launcher keeps them."""
        return ""

    def close(self) -> None:
        """The one exit path: stop the participant and release all it holds (idempotent)."""
        self.stop()

    def __enter__(self) -> ParticipantHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def drop_connection(conn: Any) -> None:
    """Close an rpyc connection without waiting for the peer: rpyc's own ``close()``
    waits for a reply to its goodbye, which a stopped participant never sends. The
    participant sees the connection drop and exits by itself."""
    if conn is None:
        return
    try:
        conn._channel.stream.close()
    except Exception:  # already closed
        pass
    try:
        conn.close()  # the goodbye fails at once on the closed stream; rpyc cleans up
    except Exception:
        pass


def startup_error(handle: ParticipantHandle, spec: ParticipantSpec, t0: float,
                  what: str = "starting", silent_s: float | None = None) -> TracrError | None:
    """Why a start-up wait must end now, or None: the participant went silent for its
    liveness timeout, the start-up cap passed, or the handle was stopped (Ctrl-C)."""
    if handle.stopped:
        return TracrError(f"participant {spec.instance} on {handle.host_label}: "
                          f"stopped while {what}")
    silent = handle.silent_for()
    if silent > (spec.liveness_s if silent_s is None else silent_s):
        return ParticipantLost(
            f"participant {spec.instance} on {handle.host_label} silent for {silent:.0f} s "
            f"while {what} (lost)",
            hint="nothing (not even a heartbeat) arrived; raise run.liveness_timeout_s "
            "for a device that stalls this long",
        )
    if time.monotonic() - t0 > spec.startup_s:
        return TracrError(
            f"participant {spec.instance} on {handle.host_label} not ready after "
            f"{spec.startup_s:.0f} s (run.startup_timeout_s)",
            hint="it was alive (heartbeats arrived) but slow; raise run.startup_timeout_s",
        )
    return None


class Launcher(ABC):
    """Starts participants on one device."""

    @abstractmethod
    def start(self, spec: ParticipantSpec,
              adopt: Callable[[ParticipantHandle], None] | None = None) -> ParticipantHandle:
        """Start a participant and return its handle once its control connection is up.

        ``adopt`` is given the handle as soon as its process exists, before the READY
        wait, so the caller owns it (heartbeats, Ctrl-C) while it starts. On failure
        everything started so far is torn down before the error is raised.
        """
