"""Facts about where a run's participants run, gathered before the run and handed to it.

The observer does not look anything up about the hosts it deploys to: whoever
plans the run (:mod:`app_api.runner.labfacts` for the emulated lab) gathers
these and passes them in, so the observer knows nothing of the lab.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class LabFacts:
    """What the emulated lab knows about a run's hosts; empty when none runs on the lab.

    ``link`` is the lab's link report (configured and measured), recorded in
    ``summary.json`` under ``network.lab``. ``cpu_quotas`` maps a device to the
    CPU quota the lab put on it (``{quota_ms, period_ms, fraction, source}``):
    a participant inside a lab host cannot read its own cgroup quota, so the
    observer passes this one on. ``lab_check`` is how the lab that is up compared with
    the one the manifest states (:mod:`app_api.runner.labcheck`; ``summary.json``
    ``lab_check``), None when the manifest states none.
    """

    link: Mapping[str, Any] | None = None
    cpu_quotas: Mapping[str, Mapping[str, Any]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    lab_check: Mapping[str, Any] | None = None
    #: ``(t0, t1) -> rows``: the lab links' configured state over that wall-clock span
    #: (:func:`app_api.runner.labfacts.lab_timeline`), None off the lab
    timeline: Callable[[float, float], list[dict]] | None = None
    #: ``(t0_ms, t1_ms) -> rows``: the lab pacer's holds of each host over that span
    #: (``perf_counter`` ms; :func:`app_api.runner.labfacts.lab_holds`), None unpaced
    holds: Callable[[float, float], list[dict]] | None = None

    def cpu_quota(self, device: str) -> dict | None:
        """The lab's CPU quota on ``device`` (a fresh dict), or None when it has none."""
        quota = self.cpu_quotas.get(device)
        return dict(quota) if quota else None

    def link_report(self) -> dict | None:
        """The lab link report to record (a fresh dict), or None when there is none."""
        return dict(self.link) if self.link else None

    def link_bandwidth(self) -> str | None:
        """The rate the lab link was shaped to for this run (``"8MB/s"``), or None."""
        conf = (self.link or {}).get("configured") or {}
        return conf.get("bandwidth") or None
