"""Devices: the registry of paired devices, pairing, probing and the ssh plumbing.

Starting participants on a device is :mod:`app_api.launch`'s job; it imports this
package, never the other way round.
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
    "get_device",
    "known_hosts_path",
    "registry_path",
]
