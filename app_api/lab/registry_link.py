"""Pairing lab hosts in tracr's device registry (``lab-1`` … ``lab-N``, tagged ``lab``)."""

from __future__ import annotations

import logging

from app_api.devices.registry import Device, DeviceRegistry

log = logging.getLogger(__name__)


def register_hosts(state: dict) -> list[str]:
    """Add every lab host of ``state`` to the device registry; return the names added."""
    reg = DeviceRegistry.load()
    names = []
    for h in state["hosts"]:
        quota = f", cpu {h['cpu_quota']:g} core" if h.get("cpu_quota") is not None else ""
        reg.add(
            Device(
                name=h["name"],
                host=h["address"],
                user="root",
                port=22,
                key=state["client_key"],
                python=state["python"],
                data_host=h["address"],
                description=f"tracr lab host (netns {h['ns']}{quota})",
                tags=["lab"],
                known_hosts=state["known_hosts"],
            )
        )
        names.append(h["name"])
    reg.save()
    return names


def unregister_hosts(state: dict) -> list[str]:
    """Remove the lab's registry entries (those recorded, plus any ``lab-*`` tagged ``lab``)."""
    try:
        reg = DeviceRegistry.load()
    except Exception as exc:  # a broken registry must not stop the rest of the clean-up
        log.warning("could not read the device registry: %s", exc)
        return []
    recorded = set(state.get("registry") or [])
    removed = []
    for dev in reg.devices():
        ours = dev.name in recorded or (dev.name.startswith("lab-") and "lab" in (dev.tags or []))
        if ours and not dev.builtin:
            reg.remove(dev.name)
            removed.append(dev.name)
    if removed:
        reg.save()
    return removed
