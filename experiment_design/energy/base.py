"""The energy collector base class and its registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from experiment_design.registry import Registry

#: What a participant samples when its settings name no collector: every measured source
#: (each reports itself unsupported where the device lacks it) and the model estimate,
#: which is labelled ``estimated`` and never replaces a measured figure.
DEFAULT_COLLECTORS = ("rapl", "nvml", "jetson", "estimate")


@dataclass(frozen=True)
class Probe:
    """Whether a collector can read its source here: ``supported``, or ``reason`` why not.
    ``detail`` names what was found (domains, rails, device names, coefficients)."""

    supported: bool
    reason: str = ""
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """Plain JSON form: ``{"status": "supported"|"unsupported", "reason", "detail"}``."""
        out: dict[str, Any] = {"status": "supported" if self.supported else "unsupported"}
        if self.reason:
            out["reason"] = self.reason
        if self.detail:
            out["detail"] = self.detail
        return out


class EnergyCollector:
    """One source of energy on a device.

    ``kind`` says what :meth:`read` returns: ``"counter"`` -- joules accumulated since
    the collector started (wraps already unwound), or ``"power"`` -- watts now.
    ``label`` is ``"measured"`` or ``"estimated"``; ``method`` names the source in the
    results (``rapl``, ``nvml``, ``jetson-ina3221``, ``external``, ``estimate``).
    ``root`` is the file-system root the collector reads (tests pass a fake sysfs tree).

    Example::

        from experiment_design.energy import EnergyCollector, Probe, register_energy

        @register_energy("usb-meter")
        class UsbMeter(EnergyCollector):
            '''A USB power meter whose driver writes milliwatts to a file.'''

            kind = "power"

            def probe(self) -> Probe:
                f = self.root / "run/usb-meter/mW"
                return Probe(True) if f.exists() else Probe(False, f"{f} not found")

            def read(self, cpu_share: float = 0.0) -> float:
                return int((self.root / "run/usb-meter/mW").read_text()) / 1e3
    """

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "counter"
    label: ClassVar[str] = "measured"

    def __init__(self, root: Path | str | None = None, **params: Any) -> None:
        self.root = Path(root) if root is not None else Path("/")
        self.params = params

    @property
    def method(self) -> str:
        """The name this figure carries in the results."""
        return self.name

    def probe(self) -> Probe:
        """Whether this source can be read here (subclasses answer; never raises)."""
        return Probe(False, "not implemented")

    def read(self, cpu_share: float = 0.0) -> float:
        """Joules since start (``counter``) or watts now (``power``). ``cpu_share`` is the
        machine's busy CPU share over the last sample (0..1), for estimates."""
        raise NotImplementedError

    def info(self) -> dict:
        """What the results state beside the figures: method, label, kind, caveats."""
        return {"method": self.method, "label": self.label, "kind": self.kind}

    def close(self) -> None:
        """Release what :meth:`probe` opened (a library handle)."""


#: name -> EnergyCollector subclass; every module of ``experiment_design.energy`` registers.
ENERGY: Registry[type[EnergyCollector]] = Registry(
    "energy collector", ["experiment_design.energy"], base=EnergyCollector,
    hint="settings.energy names collectors (tracr: rapl, nvml, jetson, external, estimate)")


def register_energy(name: str | None = None) -> Callable[[type[EnergyCollector]],
                                                          type[EnergyCollector]]:
    """Class decorator: register an :class:`EnergyCollector` subclass under ``name``."""
    return ENERGY.register(name)


def create_energy(name: str, root: Path | str | None = None, **params: Any) -> EnergyCollector:
    """The collector registered as ``name``, built with ``params``."""
    return ENERGY.get(name)(root, **params)


def list_energy() -> list[str]:
    """Registered collector names, sorted."""
    return ENERGY.names()
