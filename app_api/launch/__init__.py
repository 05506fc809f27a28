"""Launching participants: a local and an SSH launcher as siblings over one base.

- :mod:`app_api.launch.base`: :class:`ParticipantSpec`, the launched
  :class:`ParticipantHandle` (a context manager owning process, tunnel and temp
  dir) and the :class:`Launcher` interface;
- :mod:`app_api.launch.local`: the built-in ``localhost`` device, one child process
  per participant;
- :mod:`app_api.launch.ssh`: zero-deploy over SSH into a temp venv on a paired
  device (:mod:`app_api.launch.bundle` is what it ships, :mod:`app_api.launch.remote`
  what it asks of the device's shell);
- :func:`launcher_for`: the one factory.

This package uses :mod:`app_api.devices` (the registry, ssh options) and never
:mod:`app_api.runner`, which uses it.
"""

from __future__ import annotations

from app_api.launch.base import Launcher, ParticipantHandle, ParticipantLost, ParticipantSpec
from app_api.launch.factory import launcher_for
from app_api.launch.local import LocalLauncher, LocalParticipant
from app_api.launch.ssh import SSHLauncher, SSHParticipant

__all__ = [
    "Launcher",
    "LocalLauncher",
    "LocalParticipant",
    "ParticipantHandle",
    "ParticipantLost",
    "ParticipantSpec",
    "SSHLauncher",
    "SSHParticipant",
    "launcher_for",
]
