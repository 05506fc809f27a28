"""The device registry: paired devices in one YAML file outside the repository.

The file lives at ``$TRACR_DEVICES``, else ``$TRACR_CONFIG_DIR/devices.yaml``
(``~/.config/tracr/devices.yaml`` by default). Private keys are referenced by
path and never copied. ``localhost`` is built in: always present, never stored.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from app_api.fsutil import atomic_write, read_text
from experiment_design.errors import TracrError, UnknownNameError

LOCALHOST = "localhost"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_HOST_RE = re.compile(r"^[A-Za-z0-9._:%\[\]-]+$")
_USER_RE = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]*\$?$")


def config_dir() -> Path:
    """tracr's configuration directory (``$TRACR_CONFIG_DIR`` or ``~/.config/tracr``)."""
    env = os.environ.get("TRACR_CONFIG_DIR")
    return Path(env).expanduser() if env else Path.home() / ".config" / "tracr"


def registry_path() -> Path:
    """Where the registry lives: ``$TRACR_DEVICES`` or ``$TRACR_CONFIG_DIR/devices.yaml``."""
    env = os.environ.get("TRACR_DEVICES")
    return Path(env).expanduser() if env else config_dir() / "devices.yaml"


def known_hosts_path() -> Path:
    """tracr's own known_hosts file (host keys recorded at pairing, trust on first use)."""
    return config_dir() / "known_hosts"


@dataclass
class Device:
    """One paired device: how to log in, which python to use, how partners reach it."""

    name: str
    host: str
    user: str
    port: int = 22
    key: str = ""
    python: str = "python3"
    data_host: str | None = None
    description: str = ""
    tags: list[str] = field(default_factory=list)
    known_hosts: str = ""
    last_check: dict[str, Any] | None = None

    @property
    def builtin(self) -> bool:
        """True for the built-in ``localhost`` device."""
        return self.name == LOCALHOST

    @property
    def address(self) -> str:
        """Address partners use to reach this device's data server."""
        return self.data_host or self.host

    @property
    def target(self) -> str:
        """``user@host`` for ssh."""
        return f"{self.user}@{self.host}"

    def known_hosts_file(self) -> Path:
        """The known_hosts file used for this device (tracr's own by default)."""
        return Path(self.known_hosts).expanduser() if self.known_hosts else known_hosts_path()

    def validate(self) -> None:
        """Raise TracrError naming the first bad field."""
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise TracrError(
                f"Invalid device name {self.name!r}.",
                hint="Use letters, digits, '.', '_' or '-' (at most 63 characters).",
            )
        if self.name == LOCALHOST:
            raise TracrError("'localhost' is built in and cannot be paired or stored.")
        if not isinstance(self.host, str) or not _HOST_RE.match(self.host):
            raise TracrError(f"Device '{self.name}': invalid host {self.host!r}.")
        if not isinstance(self.user, str) or not _USER_RE.match(self.user):
            raise TracrError(f"Device '{self.name}': invalid user {self.user!r}.")
        if (
            isinstance(self.port, bool)
            or not isinstance(self.port, int)
            or not 0 < self.port < 65536
        ):
            raise TracrError(f"Device '{self.name}': port must be 1..65535, not {self.port!r}.")
        if not isinstance(self.key, str):
            raise TracrError(f"Device '{self.name}': key must be a path, not {self.key!r}.")
        if not isinstance(self.python, str) or not self.python.strip():
            raise TracrError(f"Device '{self.name}': python must name an interpreter.")
        if self.data_host is not None and (
            not isinstance(self.data_host, str) or not _HOST_RE.match(self.data_host)
        ):
            raise TracrError(f"Device '{self.name}': invalid data_host {self.data_host!r}.")
        if not isinstance(self.description, str):
            raise TracrError(f"Device '{self.name}': description must be text.")
        if not isinstance(self.tags, list) or not all(isinstance(t, str) for t in self.tags):
            raise TracrError(f"Device '{self.name}': tags must be a list of strings.")
        if self.last_check is not None and not isinstance(self.last_check, dict):
            raise TracrError(f"Device '{self.name}': last_check must be a mapping.")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for the YAML file (without the name, which is the key)."""
        d = asdict(self)
        d.pop("name")
        return d

    @classmethod
    def from_dict(cls, name: str, data: dict[str, Any]) -> Device:
        """Build and validate a device from its YAML mapping."""
        if not isinstance(data, dict):
            raise TracrError(f"Device '{name}': entry must be a mapping.")
        allowed = {f.name for f in fields(cls)} - {"name"}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise TracrError(
                f"Device '{name}': unknown field(s) {', '.join(unknown)}.",
                hint=f"Valid fields: {', '.join(sorted(allowed))}.",
            )
        missing = [k for k in ("host", "user") if k not in data]
        if missing:
            raise TracrError(f"Device '{name}': missing field(s) {', '.join(missing)}.")
        kwargs = dict(data)
        if kwargs.get("tags") is None:
            kwargs["tags"] = []
        if kwargs.get("description") is None:
            kwargs["description"] = ""
        if kwargs.get("key") is None:
            kwargs["key"] = ""
        if kwargs.get("known_hosts") is None:
            kwargs["known_hosts"] = ""
        dev = cls(name=name, **kwargs)
        dev.validate()
        return dev


def localhost_device() -> Device:
    """The built-in ``localhost`` device (this machine, this python)."""
    return Device(
        name=LOCALHOST,
        host="127.0.0.1",
        user=os.environ.get("USER") or "local",
        python=sys.executable,
        description="this machine (built in)",
        tags=["builtin"],
    )


class DeviceRegistry:
    """Paired devices, loaded from and saved to one YAML file.

    >>> reg = DeviceRegistry.load()
    >>> reg.add(Device(name="pi4", host="10.0.0.7", user="pi", key="~/.ssh/id_ed25519"))
    >>> reg.save()
    """

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path).expanduser() if path else registry_path()
        self._devices: dict[str, Device] = {}

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> DeviceRegistry:
        """Read the registry (an absent file is an empty registry)."""
        reg = cls(path)
        text = read_text(reg.path)  # a root-owned leftover is a clear error, not a traceback
        if text is None:
            return reg
        import yaml

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise TracrError(
                f"Device registry {reg.path} is not valid YAML: {exc}",
                hint="Fix or remove the file; `tracr device pair` recreates entries.",
            ) from exc
        devices = data.get("devices", {}) if isinstance(data, dict) else None
        if not isinstance(devices, dict):
            raise TracrError(f"Device registry {reg.path}: expected a 'devices:' mapping.")
        for name, entry in devices.items():
            reg._devices[str(name)] = Device.from_dict(str(name), entry)
        return reg

    def names(self) -> list[str]:
        """All device names, ``localhost`` first."""
        return [LOCALHOST, *sorted(self._devices)]

    def devices(self) -> list[Device]:
        """All devices, ``localhost`` first."""
        return [localhost_device(), *(self._devices[n] for n in sorted(self._devices))]

    def __contains__(self, name: object) -> bool:
        return name == LOCALHOST or name in self._devices

    def get(self, name: str) -> Device:
        """The device called ``name``; unknown names list the valid ones."""
        if name == LOCALHOST:
            return localhost_device()
        try:
            return self._devices[name]
        except KeyError:
            raise UnknownNameError(
                "device", name, self.names(), hint="Pair it first: `tracr device pair`."
            ) from None

    def add(self, device: Device) -> None:
        """Add or replace a device (validated)."""
        device.validate()
        self._devices[device.name] = device

    def remove(self, name: str) -> Device:
        """Remove a device and return it; ``localhost`` cannot be removed."""
        if name == LOCALHOST:
            raise TracrError("'localhost' is built in and cannot be removed.")
        dev = self.get(name)
        del self._devices[name]
        return dev

    def save(self) -> Path:
        """Write the registry atomically (mode 0600; the invoking user's under sudo)."""
        import yaml

        body = {"devices": {n: self._devices[n].to_dict() for n in sorted(self._devices)}}
        text = "# tracr device registry (written by `tracr device`)\n" + yaml.safe_dump(
            body, sort_keys=False, default_flow_style=False
        )
        return atomic_write(self.path, text, mode=0o600)


def get_device(name: str) -> Device:
    """Look a device up in the current registry (``localhost`` included)."""
    return DeviceRegistry.load().get(name)
