"""A model-based estimate for devices without sensors: idle + dynamic x CPU share.

``P = idle_w + (max_w - idle_w) * share``, where ``share`` is the machine's busy CPU
share over the last sample (/proc/stat: every process, as a meter at the plug would see
it; this process's share where /proc/stat cannot be read). It estimates the device's
power, like the measured collectors, so participants on one device count it once. It is a linear power model
(the one behind CodeCarbon's and Eco2AI's TDP estimates, with a floor), not a
measurement: every figure it gives is labelled ``estimated`` and carries its coefficients
and their source. The defaults are the figures commonly published for a Raspberry Pi 4
Model B (about 2.7 W idle and 6.4 W with all four cores busy, at the USB-C input);
another device's own figures go in ``settings.energy: {estimate: {idle_w, max_w,
source}}``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiment_design.energy.base import EnergyCollector, Probe, register_energy

PI4_IDLE_W = 2.7
PI4_MAX_W = 6.4
PI4_SOURCE = ("Raspberry Pi 4 Model B, published board figures at the USB-C input "
              "(idle about 2.7 W, four cores busy about 6.4 W); not measured by tracr")


@register_energy("estimate")
class EstimateCollector(EnergyCollector):
    """Watts from a linear model of the participant's CPU share (labelled estimated)."""

    kind = "power"
    label = "estimated"

    def __init__(self, root: Path | str | None = None, idle_w: float | None = None,
                 max_w: float | None = None, source: str | None = None,
                 **params: Any) -> None:
        super().__init__(root, **params)
        given = idle_w is not None or max_w is not None
        self.idle_w = float(PI4_IDLE_W if idle_w is None else idle_w)
        self.max_w = float(PI4_MAX_W if max_w is None else max_w)
        self.source = source or ("given in settings.energy.estimate" if given else PI4_SOURCE)

    def probe(self) -> Probe:
        """Always supported, with its coefficients; refuses a model that makes no sense."""
        if not 0 <= self.idle_w <= self.max_w:
            return Probe(False, f"estimate needs 0 <= idle_w ({self.idle_w}) <= max_w "
                                f"({self.max_w})")
        return Probe(True)

    def coefficients(self) -> dict:
        """The model and where its numbers come from."""
        return {"model": "idle_w + (max_w - idle_w) * cpu_share", "idle_w": self.idle_w,
                "max_w": self.max_w, "source": self.source}

    def read(self, cpu_share: float = 0.0) -> float:
        """Estimated watts at this CPU share (clamped to 0..1)."""
        share = min(1.0, max(0.0, float(cpu_share)))
        return self.idle_w + (self.max_w - self.idle_w) * share

    def info(self) -> dict:
        """Method, label ``estimated``, and the coefficients with their source."""
        return {**super().info(), **self.coefficients()}
