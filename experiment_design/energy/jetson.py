"""NVIDIA Jetson: the board's input power from its INA3221 monitor in sysfs.

A Jetson's INA3221 chips measure several rails; only the input rail (``VDD_IN`` on
Orin and Xavier NX, ``POM_5V_IN`` on Nano and TX2) is the board's power, as jtop shows
it. The other rails (CPU, GPU, SoC) are parts of it: their sum is neither the input nor
a lower bound of it (regulator losses, rails not monitored), so the collector refuses to
add them and reports unsupported when no input rail is found. Two driver layouts:

- L4T 32 (``ina3221x``): ``/sys/bus/i2c/drivers/ina3221x/<dev>/iio:device<N>/``
  with ``rail_name_<c>`` and ``in_power<c>_input`` (milliwatts);
- L4T 34+ (``ina3221``): ``/sys/bus/i2c/drivers/ina3221/<dev>/hwmon/hwmon<N>/`` with
  ``in<c>_label``, ``in<c>_input`` (millivolts) and ``curr<c>_input`` (milliamps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiment_design.energy.base import EnergyCollector, Probe, register_energy

#: the rails that are the board's input, by module generation
INPUT_RAILS = ("VDD_IN", "POM_5V_IN", "VIN_SYS_5V0", "VDDIN")
DRIVERS = "sys/bus/i2c/drivers"


def _read(path: Path) -> str:
    return path.read_text().strip()


@register_energy("jetson")
class JetsonCollector(EnergyCollector):
    """The Jetson input rail's power (watts), read from the INA3221 driver."""

    kind = "power"

    def __init__(self, root: Path | str | None = None, **params: Any) -> None:
        super().__init__(root, **params)
        self._power: Path | None = None
        self._volt: Path | None = None
        self._curr: Path | None = None
        self.rail = ""

    def _rails(self) -> list[tuple[str, tuple[Path, ...]]]:
        """(label, files) of every rail found: one file (mW) or two (mV, mA)."""
        out: list[tuple[str, tuple[Path, ...]]] = []
        old = self.root / DRIVERS / "ina3221x"
        for name_file in sorted(old.glob("*/iio:device*/rail_name_*")):
            c = name_file.name.rsplit("_", 1)[1]
            out.append((_read(name_file), (name_file.parent / f"in_power{c}_input",)))
        new = self.root / DRIVERS / "ina3221"
        for label in sorted(new.glob("*/hwmon/hwmon*/in*_label")):
            c = label.name[2:-len("_label")]
            out.append((_read(label), (label.parent / f"in{c}_input",
                                       label.parent / f"curr{c}_input")))
        return out

    def probe(self) -> Probe:
        """Supported when an input rail is found and reads."""
        drivers = self.root / DRIVERS
        if not (drivers / "ina3221x").is_dir() and not (drivers / "ina3221").is_dir():
            return Probe(False, "no INA3221 driver in sysfs (not a Jetson)")
        rails = self._rails()
        inputs = [(lab, files) for lab, files in rails if lab.upper() in INPUT_RAILS]
        if not inputs:
            return Probe(False, "no input rail among the INA3221 rails "
                                f"{sorted(lab for lab, _ in rails)}: a sum of rails is not "
                                "the board's input", {"rails": sorted(lab for lab, _ in rails)})
        self.rail, files = inputs[0]
        if len(files) == 1:
            self._power = files[0]
        else:
            self._volt, self._curr = files
        try:
            watts = self.read()
        except (OSError, ValueError) as exc:
            return Probe(False, f"input rail {self.rail} unreadable: {exc}")
        return Probe(True, detail={"rail": self.rail, "watts_at_probe": round(watts, 3),
                                   "rails": sorted(lab for lab, _ in rails)})

    def read(self, cpu_share: float = 0.0) -> float:
        """Watts on the input rail now."""
        if self._power is not None:
            return int(_read(self._power)) / 1e3
        return int(_read(self._volt)) * int(_read(self._curr)) / 1e6

    def info(self) -> dict:
        """Method, the rail, and what it covers."""
        return {**super().info(), "rail": self.rail, "covers": "the whole board (input rail)"}
