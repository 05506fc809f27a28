"""How the observer starts participants: the launcher interface and `launcher_for`.

A :class:`Launcher` turns a :class:`ParticipantSpec` into a running participant
process and returns a :class:`ParticipantHandle` holding its authenticated rpyc
control connection. ``localhost`` uses :class:`app_api.runner.local.LocalLauncher`
(one local process per participant); every other device name is resolved through
``app_api.devices`` (the SSH launcher).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from experiment_design.errors import TracrError


@dataclass
class ParticipantSpec:
    """What to start: one participant instance of a role on a device."""

    instance: str
    role: str
    device: str
    threads: int | None
    secret: bytes  # control-channel secret (per run, per participant)


class ParticipantHandle(ABC):
    """A running participant as the observer sees it."""

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


class Launcher(ABC):
    """Starts participants on one device."""

    @abstractmethod
    def start(self, spec: ParticipantSpec) -> ParticipantHandle:
        """Start a participant and return its handle once its control connection is up."""


def launcher_for(device_name: str) -> Launcher:
    """The launcher for a device: ``localhost`` is built in, others come from the registry."""
    if device_name == "localhost":
        from app_api.runner.local import LocalLauncher

        return LocalLauncher()
    try:
        from app_api.devices import SSHLauncher  # type: ignore[attr-defined]
    except ImportError as exc:
        raise TracrError(
            f"Device '{device_name}' needs the SSH launcher, which is not available ({exc}).",
            hint="Use device: localhost, or pair the device with `tracr device pair`.",
        ) from exc
    return SSHLauncher(device_name)
