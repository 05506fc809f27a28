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
:func:`app_api.runner.plan.plan_runs`.

This module is also where the lab's facts about a run's hosts are gathered
(:func:`lab_facts`) and handed to the observer, which never asks the lab itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from app_api import lab
from app_api.lab.cgroup import PERIOD_US
from app_api.runner import labcheck
from app_api.runner.facts import LabFacts
from app_api.runner.observer import RunResult, run_experiment
from app_api.runner.plan import PlannedRun
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


def lab_facts(manifest: Any, link: dict | None = None) -> LabFacts:
    """What the lab knows about ``manifest``'s hosts: CPU quotas and the link report.

    ``link`` is the report measured when the link was just (re)shaped; without one,
    the lab's current report is recorded when any participant runs on a lab host.
    Off the lab (or where the lab cannot exist) the facts are empty.
    """
    devices = {inst.get("device") for inst in manifest.participant_instances}
    checked = labcheck.lab_check(manifest) if manifest.lab else None
    if devices <= {"localhost"} and link is None:
        return LabFacts(lab_check=checked)
    try:
        report = lab.link_report() or {}
    except Exception:  # no lab support on this machine: nothing to record
        return LabFacts(link=link, lab_check=checked)
    if link is None and devices & set(report.get("hosts") or []):
        link = report
    quotas = {dev: q for dev in devices if (q := _cpu_quota(report, dev))}
    return LabFacts(link=link, cpu_quotas=quotas, lab_check=checked, timeline=lab_timeline)


def lab_timeline(t0: float, t1: float) -> list[dict]:
    """The lab links' configured state from ``t0`` to ``t1`` (wall times;
    :func:`app_api.lab.timeline.link_timeline`), each row of a trace-driven link with the
    trace's clock: ``trace_t0`` (the wall time the trace started) and ``period_s``, which
    an adaptive run's scoring lines its phases up by (:mod:`app_api.results.hindsight`)."""
    from app_api.lab import timeline, trace

    clocks: dict[tuple, dict] = {}
    for row in timeline.read_timeline():  # the raw rows keep the emulator's epoch
        if row["t"] <= t1 and row.get("trace") and row.get("epoch") is not None:
            try:
                period = trace.schedule(row.get("rate_Bps") or 1e6, row["trace"]).period
            except Exception as exc:  # a trace file gone since: no clock, rates still shown
                log.info("no period for trace %s: %s", row["trace"], exc)
                continue
            clocks[(row.get("link"), row.get("dir"))] = {"trace_t0": float(row["epoch"]),
                                                         "period_s": period}
    return [{**r, **clocks.get((r.get("link"), r.get("dir")), {})}
            for r in timeline.link_timeline(t0, t1)]


def lab_quota(device: str) -> dict | None:
    """The CPU quota the lab that is up put on ``device``, or None (no lab, no quota)."""
    try:
        report = lab.link_report() or {}
    except Exception:  # no lab (or not Linux): nothing to add
        return None
    return _cpu_quota(report, device)


def _cpu_quota(report: dict, device: str) -> dict | None:
    """The CPU quota the lab put on ``device`` (``{quota_ms, period_ms, fraction, source}``,
    and ``measured``: the share of a core a busy loop got under it when the lab came up;
    ``measured_together``: the share while every limited host ran one at once).

    A participant reads its CFS quota from /sys/fs/cgroup; inside a lab host
    (``ip netns exec`` mounts a fresh /sys) that is not visible, but the lab knows
    what it configured.
    """
    cpu = ((report.get("cpu") or {}).get(device)) or {}
    quota = cpu.get("quota")
    if not quota:
        return None
    period_ms = float(cpu.get("period_us") or PERIOD_US) / 1000
    out = {"quota_ms": float(quota) * period_ms, "period_ms": period_ms,
           "fraction": float(quota), "source": "lab", "mode": cpu.get("mode") or "quota"}
    if cpu.get("measured"):
        out["measured"] = float(cpu["measured"])
    if cpu.get("measured_together"):
        out["measured_together"] = float(cpu["measured_together"])
        # the lab's hosts share this machine's CPUs (the planner's contention model)
        out["machine_cpus"] = os.cpu_count() or 1
    return out


def run_plain(run: PlannedRun, out_dir: str | os.PathLike | None = None,
              progress: bool = True) -> RunResult:
    """One run over the link as it is (the lab's report is recorded when on the lab)."""
    return run_experiment(run.manifest, out_dir=out_dir, progress=progress,
                          facts=lab_facts(run.manifest))


def run_shaped(run: PlannedRun, out_dir: str | os.PathLike | None = None,
               progress: bool = True, say: Callable[[str], None] = lambda m: None) -> RunResult:
    """One run over a lab link shaped to ``run.bandwidth``; the old shaping is put back."""
    check_lab_participants(run.manifest)
    with shaped(run.bandwidth, run.delay_ms, run.link, say=say) as report:
        return run_experiment(run.manifest, out_dir=out_dir, progress=progress,
                              facts=lab_facts(run.manifest, link=report))
