"""The manifest's ``network`` section: shape the lab link before a run, record it, restore it.

``network.bandwidth: 4MB/s`` (or ``--set network.bandwidth=16MB/s``) means "run
over a link shaped to this rate". Only the emulated lab can shape a link, so
every participant must sit on a lab host (``lab-1``, ``lab-2`` ...) of the lab
that is up; anything else is refused before a device is touched. The runner
reshapes with :func:`app_api.lab.shape`, which re-measures the link, and the
measured report goes into ``summary.json`` under ``network.lab``. The lab's
shaping from before the run is put back afterwards, whatever happened.

``network.bandwidths: [1MB/s, 4MB/s, ...]`` runs one experiment per rate
(:mod:`app_api.runner.bandwidths`). A ``--set network.bandwidth=...`` on the
command line wins over a list in the file: one run at that rate.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from experiment_design.errors import TracrError

log = logging.getLogger(__name__)


def _set_by_override(overrides: list[str], key: str) -> bool:
    return any(o.lstrip("+").split("=", 1)[0].strip() == key for o in overrides or [])


def requested_bandwidths(manifest: Any) -> list[str] | None:
    """The rates this run asks for: None (no shaping), one rate, or the list to loop over."""
    net = dict(manifest.network or {})
    overrides = list(manifest.overrides or [])
    single, many = net.get("bandwidth"), net.get("bandwidths")
    if single not in (None, "") and _set_by_override(overrides, "network.bandwidth") \
            and not _set_by_override(overrides, "network.bandwidths"):
        return [str(single)]
    if many:
        return [str(b) for b in many]
    if single not in (None, ""):
        return [str(single)]
    return None


def lab_hosts() -> list[str]:
    """Names of the hosts of the lab that is up ([] when none)."""
    from app_api.lab import load_state

    state = load_state() or {}
    return [h["name"] for h in state.get("hosts") or []]


def check_lab_participants(manifest: Any) -> list[str]:
    """Refuse (exit 2) unless a lab is up and every participant runs on one of its hosts.

    Returns the lab's host names.
    """
    net = dict(manifest.network or {})
    unsupported = [k for k in ("jitter_ms", "loss_pct") if net.get(k) not in (None, 0)]
    if unsupported:
        raise TracrError(
            f"network.{unsupported[0]} is set, but the lab shapes only bandwidth and delay_ms.",
            hint=f"remove it (--set ~network.{unsupported[0]}) or set it to null",
        )
    hosts = lab_hosts()
    devices = {i["name"]: i["device"] for i in manifest.participant_instances}
    off_lab = {inst: dev for inst, dev in devices.items() if dev not in hosts}
    if not hosts:
        raise TracrError(
            "network.bandwidth is set, but no tracr lab is up: only the lab can shape a link.",
            hint="start one (sudo tracr lab up --hosts 2 --bandwidth 4MB/s), or run without "
            "shaping: --set network.bandwidth=null --set network.bandwidths=null",
        )
    if off_lab:
        where = ", ".join(f"{i} on {d}" for i, d in sorted(off_lab.items()))
        raise TracrError(
            f"network.bandwidth is set, but not every participant is on a lab device ({where}); "
            "tracr can only shape the link between lab hosts.",
            hint=f"put the participants on {', '.join(hosts)} "
            "(--set participant_instances.NAME.device=lab-1), or drop the shaping: "
            "--set network.bandwidth=null --set network.bandwidths=null",
        )
    return hosts


def current_shaping() -> dict:
    """The lab's shaping now: ``{"bandwidth": str|None, "delay_ms": float|None}``."""
    from app_api.lab import link_report

    conf = (link_report() or {}).get("configured") or {}
    return {"bandwidth": conf.get("bandwidth"), "delay_ms": conf.get("delay_ms")}


def apply(bandwidth: str | None, delay_ms: float | None, say=lambda m: None) -> dict:
    """Shape the lab link and return its measured ``link_report()`` (plus what was asked)."""
    from app_api.lab import shape

    report = shape(bandwidth=bandwidth, delay_ms=delay_ms, verify=True, say=say)
    report = dict(report or {})
    report["requested"] = {"bandwidth": bandwidth, "delay_ms": delay_ms}
    asked = report.get("configured", {}).get("bandwidth_Bps")
    got = report.get("bandwidth_Bps")
    if asked and got:
        report["measured_ratio"] = got / asked
        if not 0.7 <= got / asked <= 1.2:
            log.warning("the lab link measures %.0f B/s, %.0f%% of the %s asked for",
                        got, 100 * got / asked, bandwidth)
    return report


@contextlib.contextmanager
def shaped(bandwidth: str | None, delay_ms: float | None = None,
           say=lambda m: None) -> Iterator[dict]:
    """Shape the lab link for the ``with`` body; put the previous shaping back afterwards."""
    before = current_shaping()
    try:
        yield apply(bandwidth, delay_ms, say=say)
    finally:
        with contextlib.suppress(TracrError):
            if lab_hosts():
                restore(before, say=say)


@contextlib.contextmanager
def keep_shaping(say=lambda m: None) -> Iterator[dict]:
    """Remember the lab's shaping and restore it when the ``with`` body ends (bandwidth loops)."""
    before = current_shaping()
    try:
        yield before
    finally:
        with contextlib.suppress(TracrError):
            if lab_hosts():
                restore(before, say=say)


def restore(before: dict, say=lambda m: None) -> None:
    """Put back a shaping captured by :func:`current_shaping` (re-measured, so
    ``tracr lab ls`` shows the restored link's figures again)."""
    from app_api.lab import shape

    if current_shaping() == before:
        return
    shape(bandwidth=before.get("bandwidth"), delay_ms=before.get("delay_ms"), verify=True,
          say=say)
    say(f"lab link restored to {before.get('bandwidth') or 'unshaped'}")


def run_shaped(manifest: Any, bandwidth: str, out_dir=None, progress: bool = True,
               say=lambda m: None):
    """One run over a lab link shaped to ``bandwidth``; returns the observer's RunResult."""
    from app_api.runner.observer import run_experiment

    check_lab_participants(manifest)
    delay = (manifest.network or {}).get("delay_ms")
    with shaped(bandwidth, delay, say=say) as report:
        return run_experiment(manifest, out_dir=out_dir, progress=progress, lab_link=report)
