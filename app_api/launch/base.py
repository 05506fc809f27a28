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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import TracebackType
from typing import Any


@dataclass
class ParticipantSpec:
    """What to start: one participant instance of a role on a device."""

    instance: str
    role: str
    device: str
    threads: int | None
    secret: bytes  # control-channel secret (per run, per participant)


class ParticipantHandle(ABC):
    """A launched participant as the observer sees it; owns what its launch created."""

    instance: str
    device: str
    host_label: str
    conn: Any  # rpyc.Connection, authenticated
    data_host: str  # address partners use to reach this participant's data server
    pid: int | None = None

    @abstractmethod
    def alive(self) -> bool:
        """True while the participant process runs."""

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


class Launcher(ABC):
    """Starts participants on one device."""

    @abstractmethod
    def start(self, spec: ParticipantSpec) -> ParticipantHandle:
        """Start a participant and return its handle once its control connection is up.

        On failure everything started so far is torn down before the error is raised.
        """
