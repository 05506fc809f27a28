"""Devices: the registry of paired devices, pairing, probing and zero-deploy over SSH.

The SSH launcher (and the runner types it needs) loads on first use, so importing the
registry stays cheap.
"""

from __future__ import annotations

from app_api.devices.registry import (
    LOCALHOST,
    Device,
    DeviceRegistry,
    get_device,
    known_hosts_path,
    registry_path,
)

__all__ = [
    "LOCALHOST",
    "Device",
    "DeviceRegistry",
    "SSHLauncher",
    "SSHParticipantHandle",
    "get_device",
    "known_hosts_path",
    "launcher_for_device",
    "registry_path",
]


def __getattr__(name: str):
    if name in ("SSHLauncher", "SSHParticipantHandle", "launcher_for_device"):
        from app_api.devices import deploy

        return getattr(deploy, name)
    raise AttributeError(name)
