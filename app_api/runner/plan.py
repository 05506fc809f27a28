"""Planning ``tracr experiment run``: a manifest and its overrides become a list of runs.

::

    plan_runs(manifest)   # -> RunPlan(kind, runs)
      plain:  one run, the lab link (if any) left as it is
      shaped: one run over the lab link shaped to network.bandwidth
      sweep:  one run per rate in network.bandwidths, grouped in one directory

Each planned run carries its own validated manifest: a sweep derives one per rate
from the loaded manifest plus two overrides (``network.bandwidth=<rate>``,
``network.bandwidths=null``), so every rate is checked before any device is
touched and the file is read once. Plans are frozen and print as the runs they
stand for; :mod:`app_api.runner.execute` carries them out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app_api.manifest import Manifest, Override, derive_manifest

PLAIN, SHAPED, SWEEP = "plain", "shaped", "sweep"


@dataclass(frozen=True)
class PlannedRun:
    """One run: its manifest and the rate to shape the lab link to first (None: leave it).

    ``subdir`` is where a sweep puts this run inside its group directory.
    """

    manifest: Manifest
    bandwidth: str | None = None
    delay_ms: float | None = None
    subdir: str | None = None

    def __str__(self) -> str:
        link = f" over a lab link shaped to {self.bandwidth}" if self.bandwidth else ""
        where = f" -> {self.subdir}/" if self.subdir else ""
        return f"run {self.manifest.name}{link}{where}"


@dataclass(frozen=True)
class RunPlan:
    """What ``tracr experiment run`` will do: ``kind`` (plain, shaped, sweep) and its runs."""

    kind: str
    manifest: Manifest
    runs: tuple[PlannedRun, ...]

    @property
    def bandwidths(self) -> list[str]:
        """The rates the plan shapes the lab link to, in order ([] for a plain run)."""
        return [r.bandwidth for r in self.runs if r.bandwidth is not None]

    def __str__(self) -> str:
        head = f"{self.kind} plan for {self.manifest.name}"
        if self.manifest.overrides:
            head += " (" + " ".join(f"--set {o}" for o in self.manifest.overrides) + ")"
        return "\n".join([head, *(f"  {r}" for r in self.runs)])


def requested_bandwidths(manifest: Manifest) -> list[str] | None:
    """The rates a run asks for: None (no shaping), one rate, or the list to loop over.

    ``network.bandwidth`` set by an override wins over a ``network.bandwidths``
    list in the file (one run at that rate), unless the list was overridden too.
    """
    net = dict(manifest.network or {})
    single, many = net.get("bandwidth"), net.get("bandwidths")
    overrides = manifest.parsed_overrides
    if single not in (None, "") and _set_by(overrides, "network.bandwidth") \
            and not _set_by(overrides, "network.bandwidths"):  # fmt: skip
        return [str(single)]
    if many:
        return [str(b) for b in many]
    if single not in (None, ""):
        return [str(single)]
    return None


def plan_runs(manifest: Manifest) -> RunPlan:
    """The runs ``manifest`` (with the overrides it was loaded with) asks for."""
    bandwidths = requested_bandwidths(manifest)
    delay = (manifest.network or {}).get("delay_ms")
    if bandwidths is None:
        return RunPlan(PLAIN, manifest, (PlannedRun(manifest),))
    if len(bandwidths) == 1:
        return RunPlan(SHAPED, manifest, (PlannedRun(manifest, bandwidths[0], delay),))
    runs = tuple(
        PlannedRun(
            derive_manifest(manifest, [
                Override.parse(f"network.bandwidth={bw}"),
                Override.parse("network.bandwidths=null"),
            ]),
            bw,
            delay,
            subdir=bandwidth_dir_name(bw),
        )  # fmt: skip
        for bw in bandwidths
    )
    return RunPlan(SWEEP, manifest, runs)


def bandwidth_dir_name(bandwidth: str) -> str:
    """A directory name for a rate: ``4MB/s`` -> ``bw-4MBps``, ``100Mbit`` -> ``bw-100Mbit``."""
    text = str(bandwidth).strip().replace("/s", "ps").replace("/", "p")
    return "bw-" + re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def _set_by(overrides: tuple[Override, ...], key: str) -> bool:
    return any(o.sets(key) for o in overrides)
