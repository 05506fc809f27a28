"""Intel and AMD RAPL package energy through the powercap sysfs tree.

Each top-level zone ``/sys/class/powercap/intel-rapl:N`` (one per CPU package; AMD's
kernel driver exposes the same tree) counts microjoules in ``energy_uj`` up to
``max_energy_range_uj`` and then wraps to 0. The collector sums the packages and unwinds
each wrap, which is unambiguous as long as a package spends less than its range between
two reads (a range of 2^32 uJ is 4295 J: over 40 s at 100 W, against a 50 ms sampler).
Sub-zones (``intel-rapl:N:M``: core, uncore, dram) are inside their package's figure and
are not added again. Since 2020 ``energy_uj`` is readable by root only on most
distributions: the probe says so rather than reading zero.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from experiment_design.energy.base import EnergyCollector, Probe, register_energy

POWERCAP = "sys/class/powercap"
_PACKAGE = re.compile(r"^(intel|amd)-rapl:\d+$")


@register_energy("rapl")
class RaplCollector(EnergyCollector):
    """CPU package energy (joules, a counter) from powercap's RAPL zones."""

    kind = "counter"

    def __init__(self, root: Path | str | None = None, **params: Any) -> None:
        super().__init__(root, **params)
        self.zones: list = []
        self._last: list[int] = []
        self._ranges: list[int] = []
        self._total_uj = 0

    def probe(self) -> Probe:
        """Supported when at least one package zone's counter can be read."""
        base = self.root / POWERCAP
        if not base.is_dir():
            return Probe(False, f"no powercap tree ({base} absent)")
        zones = sorted(p for p in base.iterdir() if _PACKAGE.match(p.name))
        if not zones:
            return Probe(False, f"no RAPL package zone under {base}")
        found, why = [], []
        for z in zones:
            try:
                now = int((z / "energy_uj").read_text())
                rng = int((z / "max_energy_range_uj").read_text())
            except PermissionError:
                why.append(f"{z.name}/energy_uj not readable (root only on this system)")
                continue
            except (OSError, ValueError) as exc:
                why.append(f"{z.name}: {exc}")
                continue
            found.append((z, now, rng))
        if not found:
            return Probe(False, "; ".join(why))
        self.zones = [z for z, _, _ in found]
        self._last = [now for _, now, _ in found]
        self._ranges = [rng for _, _, rng in found]
        self._total_uj = 0
        names = []
        for z in self.zones:
            try:
                names.append(f"{z.name} ({(z / 'name').read_text().strip()})")
            except OSError:
                names.append(z.name)
        return Probe(True, detail={"zones": names, "skipped": why} if why else {"zones": names})

    def read(self, cpu_share: float = 0.0) -> float:
        """Joules summed over the package zones since :meth:`probe`, wraps unwound."""
        for i, z in enumerate(self.zones):
            now = int((z / "energy_uj").read_text())
            delta = now - self._last[i]
            if delta < 0:  # the counter passed max_energy_range_uj and restarted at 0
                delta += self._ranges[i] + 1
            self._total_uj += delta
            self._last[i] = now
        return self._total_uj / 1e6

    def info(self) -> dict:
        """Method, kind and what the counter covers."""
        return {**super().info(), "covers": "CPU package(s): cores, caches, uncore; "
                "not the rest of the board", "zones": [z.name for z in self.zones]}
