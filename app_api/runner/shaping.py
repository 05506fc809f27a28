"""The manifest's ``network`` section: shape the lab link before a run, record it, restore it.

``network.bandwidth: 4MB/s`` (or ``--set network.bandwidth=16MB/s``) means "run
over a link shaped to this rate". Only the emulated lab can shape a link, so
every participant must sit on a lab host (``lab-1``, ``lab-2`` ...) of the lab
that is up; anything else is refused before a device is touched. The runner
reshapes with :func:`app_api.lab.shape`, which re-measures the link, and the
measured report goes into ``summary.json`` under ``network.lab``. The lab's
shaping from before the run is put back afterwards, whatever happened.

``network.bandwidths: [1MB/s, 4MB/s, ...]`` runs one experiment per rate
(:mod:`app_api.runner.bandwidths`). Which of these a run is, is decided by
:func:`app_api.runner.plan.plan_runs`; :mod:`app_api.runner.execute` carries it out.
What the lab knows of a run's hosts is gathered by :mod:`app_api.runner.labfacts`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from app_api import lab
from experiment_design.errors import TracrError

log = logging.getLogger(__name__)


def lab_hosts() -> list[str]:
    """Names of the hosts of the lab that is up ([] when none)."""
    state = lab.load_state() or {}
    return [h["name"] for h in state.get("hosts") or []]


def check_lab_participants(manifest: Any) -> list[str]:
    """Refuse (exit 2) unless a lab is up and every participant runs on one of its hosts.

    Returns the lab's host names.
    """
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


#: the link settings beyond rate and delay that a run may change and must put back
LINK_KEYS = ("jitter", "jitter_dist", "loss", "loss_model", "queue", "trace", "link_mode",
             "overrides")


def current_shaping() -> dict:
    """The lab's shaping now: ``{"bandwidth", "delay_ms", "link": {jitter, loss, trace,
    ...}}`` (what :func:`restore` puts back)."""
    conf = (lab.link_report() or {}).get("configured") or {}
    request = conf.get("request") or {}
    return {"bandwidth": conf.get("bandwidth"), "delay_ms": conf.get("delay_ms"),
            "link": {k: request[k] for k in LINK_KEYS if k in request}}


def apply(bandwidth: str | None, delay_ms: float | None, link: dict | None = None,
          say=lambda m: None) -> dict:
    """Shape the lab link and return its measured ``link_report()`` (plus what was asked).

    ``link``: jitter, loss, trace... (:func:`app_api.lab.requirement.link_args`); with
    ``link`` and no ``bandwidth`` the lab's current rate is kept (a manifest that asks for
    loss alone does not take the rate away)."""
    link = dict(link or {})
    if bandwidth is None and link:
        bandwidth = current_shaping().get("bandwidth")
    report = lab.shape(bandwidth=bandwidth, delay_ms=delay_ms, verify=True, say=say, **link)
    report = dict(report or {})
    report["requested"] = {"bandwidth": bandwidth, "delay_ms": delay_ms, **link}
    asked = report.get("configured", {}).get("bandwidth_Bps")
    got = report.get("bandwidth_Bps")
    if asked and got:
        report["measured_ratio"] = got / asked
        if not 0.7 <= got / asked <= 1.2:
            log.warning("the lab link measures %.0f B/s, %.0f%% of the %s asked for",
                        got, 100 * got / asked, bandwidth)
    return report


@contextlib.contextmanager
def shaped(bandwidth: str | None, delay_ms: float | None = None, link: dict | None = None,
           say=lambda m: None) -> Iterator[dict]:
    """Shape the lab link for the ``with`` body; put the previous shaping back afterwards."""
    with lab.link_lock():  # one shaped run at a time: no other run re-shapes the link under us
        before = current_shaping()
        try:
            yield apply(bandwidth, delay_ms, link, say=say)
        finally:
            with contextlib.suppress(TracrError):
                if lab_hosts():
                    restore(before, say=say)


@contextlib.contextmanager
def keep_shaping(say=lambda m: None) -> Iterator[dict]:
    """Remember the lab's shaping and restore it when the ``with`` body ends (bandwidth loops)."""
    with lab.link_lock():  # the whole sweep holds the link
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
    if current_shaping() == before:
        return
    link = {k: None for k in ("jitter", "loss", "loss_model", "queue", "trace")}
    link.update(before.get("link") or {})  # what the run added and the lab had not goes
    lab.shape(bandwidth=before.get("bandwidth"), delay_ms=before.get("delay_ms"), verify=True,
              say=say, **link)
    say(f"lab link restored to {before.get('bandwidth') or 'unshaped'}")
