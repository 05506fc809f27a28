"""The one place that knows which launcher a device takes."""

from __future__ import annotations

from app_api.devices.registry import LOCALHOST, Device
from app_api.launch.base import Launcher
from app_api.launch.local import LocalLauncher
from app_api.launch.ssh import SSHLauncher


def launcher_for(device: Device | str) -> Launcher:
    """The launcher for a device: local for the built-in ``localhost``, SSH for paired ones.

    ``device`` is a name (looked up in the device registry) or a :class:`Device`
    (one not in the registry, such as a throwaway loopback sshd, works too).

    >>> launcher_for("localhost")  # doctest: +ELLIPSIS
    <app_api.launch.local.LocalLauncher object at ...>
    """
    name = device if isinstance(device, str) else device.name
    if name == LOCALHOST:
        return LocalLauncher()
    return SSHLauncher(device)
