"""What the emulated lab knows about a run's hosts, gathered before the run (:class:`LabFacts`).

The observer never asks the lab itself (:mod:`app_api.runner.facts`): the runner
gathers these here, from the lab's link report and timeline, and hands them in.
Off the lab (or where the lab cannot exist) the facts are empty.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from app_api import lab
from app_api.lab import state as lab_state
from app_api.lab import timeline, trace
from app_api.lab.cgroup import PERIOD_US
from app_api.lab.holds import HOLDS_FILE, read_holds
from app_api.runner import labcheck
from app_api.runner.facts import LabFacts

log = logging.getLogger(__name__)


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
    quotas = {dev: q for dev in devices if (q := quota_from_report(report, dev))}
    paced = any(q.get("mode") == "duty" for q in quotas.values())
    return LabFacts(link=link, cpu_quotas=quotas, lab_check=checked, timeline=lab_timeline,
                    holds=lab_holds if paced else None)


def lab_holds(t0_ms: float, t1_ms: float) -> list[dict]:
    """The lab pacer's holds of each host that overlap ``t0_ms``..``t1_ms``
    (``perf_counter`` ms, the clock of ``stages.csv``): ``{host, t_stop_ms, t_cont_ms}``,
    and one row ``{host: None, t_stop_ms: covered from}`` saying where the record begins
    (:func:`app_api.lab.holds.read_holds`; the pacer keeps two files of them)."""
    state = lab_state.load_state() or {}
    if not state.get("pacer"):
        return []
    dirs, holds = read_holds(lab_state.lab_dir() / HOLDS_FILE)
    names = {h["cgroup"]: h["name"] for h in state.get("hosts") or [] if h.get("cgroup")}
    hosts = {i: names.get(d) for i, d in dirs.items()}
    rows = [{"host": None, "t_stop_ms": 1e3 * holds[0][1] if holds else None,
             "t_cont_ms": None}]
    rows += [{"host": hosts.get(i), "t_stop_ms": 1e3 * a, "t_cont_ms": 1e3 * b}
             for i, a, b in holds if 1e3 * b >= t0_ms and 1e3 * a <= t1_ms and hosts.get(i)]
    return rows


def lab_timeline(t0: float, t1: float) -> list[dict]:
    """The lab links' configured state from ``t0`` to ``t1`` (wall times;
    :func:`app_api.lab.timeline.link_timeline`), each row of a trace-driven link with the
    trace's clock: ``trace_t0`` (the wall time the trace started) and ``period_s``, which
    an adaptive run's scoring lines its phases up by (:mod:`app_api.results.hindsight`)."""
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
    return quota_from_report(report, device)


def quota_from_report(report: dict, device: str) -> dict | None:
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
