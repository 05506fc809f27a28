"""An external power meter: a user's command that prints the watts it reads now.

``settings.energy: {external: {command: "my-meter --watts"}}`` runs the command at every
sample, with a deadline (``timeout_s``, 1 s by default), and reads the first number it
prints. A command is a process start per sample (a few milliseconds of CPU on the
participant): give the sampler a longer period (``settings.sampler_ms``) for a slow one.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

from experiment_design.energy.base import EnergyCollector, Probe, register_energy

_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


@register_energy("external")
class ExternalMeter(EnergyCollector):
    """Watts printed by ``command`` (a string split like a shell's, or a list)."""

    kind = "power"

    def __init__(self, root: Path | str | None = None, command: str | list | None = None,
                 timeout_s: float = 1.0, **params: Any) -> None:
        super().__init__(root, **params)
        self.argv = shlex.split(command) if isinstance(command, str) else list(command or [])
        self.timeout_s = float(timeout_s)

    def probe(self) -> Probe:
        """Supported when the command runs and prints a number."""
        if not self.argv:
            return Probe(False, "no command given (settings.energy.external.command)")
        try:
            watts = self.read()
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            return Probe(False, f"{' '.join(self.argv)}: {exc}")
        return Probe(True, detail={"command": " ".join(self.argv), "watts_at_probe": watts})

    def read(self, cpu_share: float = 0.0) -> float:
        """The first number the command prints, in watts."""
        done = subprocess.run(self.argv, capture_output=True, text=True, check=True,
                              timeout=self.timeout_s)
        m = _NUMBER.search(done.stdout)
        if m is None:
            raise ValueError(f"printed no number: {done.stdout[:80]!r}")
        return float(m.group(0))

    def info(self) -> dict:
        """Method, kind and the command."""
        return {**super().info(), "command": " ".join(self.argv)}
