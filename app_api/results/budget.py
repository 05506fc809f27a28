"""The latency budget of each inference: do the measured parts add up to the end-to-end time?

Per inference, ``edge compute + encode + transfer + decode + later stages' compute + queue
wait`` is compared with ``e2e_ms`` (the head's clock, compute start to reply received);
the residual is what no timer accounts for. ``summary.json["latency_budget"]`` holds the
worst residual (as a share of e2e), how many inferences were above :data:`TOLERANCE` and
the parts' medians.

Where the run has ``stages.csv`` (every stage's record, its times on its own clock), each
part is read from the stage that measured it, and only differences on one clock are taken
(two hosts' clocks are never subtracted):

- encode and decode: every stage's codec timers (the reply's encode on the last stage);
- compute: each stage's ``t_end - t_start``;
- queue wait: each later stage's ``t_start - t_arrive`` (a frame received and decoded,
  waiting for the compute thread), and in throughput mode each stage's wait for its send
  thread (``t_sent - send_ms - encode_ms - t_end``);
- transfer: every stage's socket writes (``send_ms``) plus the time the head waited for
  the reply (``t_done - t_sent`` on its clock) that no later stage accounts for on its own
  clock (``t_sent - t_arrive + decode_ms``): the wire both ways, the receives, and the
  head's decoding of the reply.

The residual is then the time between a stage's compute and its send that no timer holds
(in latency mode: the hand-off inside the stage). On a lab whose CPU pacer holds the hosts
to their share (``--cpu-mode duty``), the pacer's own record of each stop of a host
(``holds.csv``, :data:`HOLDS_FILE`) is a measured part too: ``held_ms``, the part of each
sender's hand-off that its host spent stopped. The stops are the emulated device's
slowness, but they come in ticks (about 3 ms at 0.6 core and a 2 ms tick), and a hand-off
of 0.1-0.4 ms that met one is no longer time that no timer explains. So is the part of a
hand-off its thread spent ready to run and waiting for a CPU: ``cpu_wait_ms``, the thread's
run-queue wait between the end of its compute and its send, as the kernel's scheduler
counts it (``/proc/thread-self/schedstat``), measured by the stage in latency mode (in
throughput mode the hand-off is already a queue wait); a host continued by the pacer, or
one that shares its CPU with another, waits there. Without ``stages.csv`` (a run recorded
before it was written for two-party sweeps) the ``inferences.csv`` columns are summed; the
edge role writes ``transfer_ms`` as what is left of e2e, so that sum closes by
construction, and ``source`` says ``columns``.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path

from app_api.fsutil import atomic_csv
from app_api.results.store import STAGES_FILE, complete_rows
from experiment_design.protocol import HOLD_COLUMNS

#: the largest residual, as a share of e2e, for a budget that "adds up"
TOLERANCE = 0.02

PARTS = ("edge_ms", "encode_ms", "transfer_ms", "decode_ms", "cloud_ms", "queue_ms",
         "held_ms", "cpu_wait_ms")

#: the lab pacer's holds of the run's hosts (:class:`experiment_design.protocol.HoldRecord`)
HOLDS_FILE = "holds.csv"


class Holds:
    """The holds of each instance's host (ms, one clock), and where the record begins."""

    def __init__(self, rows: Iterable[Mapping]) -> None:
        self.by_instance: dict[str, list[tuple[float, float]]] = {}
        self.covered_from: float | None = None
        for r in rows:
            a, b = _f(r.get("t_stop_ms")), _f(r.get("t_cont_ms"))
            if not r.get("instance"):
                self.covered_from = a
            elif a is not None and b is not None:
                self.by_instance.setdefault(str(r["instance"]), []).append((a, b))
        for spans in self.by_instance.values():
            spans.sort()

    def held(self, instance: str, t0: float, t1: float) -> float | None:
        """Ms of ``t0``..``t1`` that ``instance``'s host spent stopped; None before the
        record begins."""
        if self.covered_from is None or t0 < self.covered_from:
            return None
        return sum(max(0.0, min(b, t1) - max(a, t0))
                   for a, b in self.by_instance.get(instance, ()) if a < t1 and b > t0)


def _f(v) -> float | None:
    if v is None or v == "":
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def from_stages(e2e_ms: float, stages: list[Mapping], holds: Holds | None = None) -> dict | None:
    """One inference's parts (ms) from its ``stages.csv`` rows (head first by ``hop``), or
    None when a time the budget needs is missing; ``holds``: the lab pacer's, if any."""
    rows = sorted(stages, key=lambda r: int(r["hop"]))
    if len(rows) < 2 or int(rows[0]["hop"]) != 0:
        return None
    head, rest = rows[0], rows[1:]
    sends = ("t_sent_ms", "send_ms", "encode_ms")
    times = ("t_start_ms", "t_end_ms")
    senders = (head, *rest[:-1])
    if any(_f(s.get(k)) is None for s in senders for k in (*times, *sends)) or any(
            _f(s.get(k)) is None for s in rest for k in (*times, "t_arrive_ms", "decode_ms")):
        return None
    piped = str(head.get("mode")) == "throughput"
    t_done = _f(head["t_start_ms"]) + e2e_ms
    parts = dict.fromkeys(PARTS, 0.0)
    parts["edge_ms"] = _f(head["t_end_ms"]) - _f(head["t_start_ms"])
    transfer = _f(head["send_ms"]) + t_done - _f(head["t_sent_ms"])
    for s in rest:
        arrive, start, end = _f(s["t_arrive_ms"]), _f(s["t_start_ms"]), _f(s["t_end_ms"])
        parts["decode_ms"] += _f(s["decode_ms"])
        parts["cloud_ms"] += end - start
        parts["queue_ms"] += start - arrive
        # the last stage's record travels in its reply, stamped before the reply's encode
        # and send, which so stay in the head's wait: the return trip
        left = _f(s["t_sent_ms"]) - _f(s["send_ms"]) if s is not rest[-1] else end
        transfer -= left - arrive + _f(s["decode_ms"])
    for s in senders:
        enc, send = _f(s["encode_ms"]), _f(s["send_ms"])
        parts["encode_ms"] += enc
        handoff = _f(s["t_sent_ms"]) - send - enc - _f(s["t_end_ms"])
        if piped:  # waiting for the stage's send thread
            parts["queue_ms"] += handoff
        else:
            held = 0.0
            if holds is not None:
                end = _f(s["t_end_ms"])
                held = holds.held(str(s.get("instance")), end, end + handoff) or 0.0
                parts["held_ms"] += held
            # the thread's own wait for a CPU in the hand-off (never the stop's time again:
            # a stopped thread is off the run queue, but the two clocks' edges may touch)
            wait = _f(s.get("cpu_wait_ms"))
            if wait is not None:
                parts["cpu_wait_ms"] += max(0.0, min(wait, handoff - held))
    parts["transfer_ms"] = transfer
    return parts


def from_columns(row: Mapping) -> dict | None:
    """One inference's parts (ms) from its ``inferences.csv`` columns, or None."""
    measured = ("queue_ms", "held_ms", "cpu_wait_ms")  # from stages.csv and holds.csv only
    vals = {k: _f(row.get(k)) for k in PARTS if k not in measured}
    if any(v is None for v in vals.values()):
        return None
    return {**vals, **dict.fromkeys(measured, 0.0)}


def latency_budget(rows: Iterable[Mapping], stages: Iterable[Mapping] = (),
                   holds: Iterable[Mapping] | None = None) -> dict | None:
    """``summary.json["latency_budget"]`` from the run's inference rows and (if any) its
    ``stages.csv`` rows and the lab pacer's ``holds.csv`` rows: per inference
    ``residual = e2e - sum(parts)``; the worst share of e2e, the count above
    :data:`TOLERANCE`, and the parts' medians. None when no successful inference has its
    parts."""
    held = Holds(holds) if holds is not None else None
    by_inf: dict[str, list[Mapping]] = {}
    for s in stages:
        if not s.get("error"):
            by_inf.setdefault(str(s.get("inference")), []).append(s)
    checked: list[tuple[str, float, dict]] = []
    sources = set()
    for r in rows:
        e2e = None if r.get("error") else _f(r.get("e2e_ms"))
        if not e2e or e2e <= 0:
            continue
        st = by_inf.get(str(r.get("inference")))
        parts = from_stages(e2e, st, held) if st and len(st) > 1 else None
        if parts is not None:
            sources.add("stages")
        elif st and len(st) > 1:
            continue  # a chain whose stage record lacks a time: not checkable
        else:
            parts = from_columns(r) if int(_f(r.get("split")) or 0) >= 0 else None
            if parts is None:
                continue
            sources.add("columns")
        checked.append((str(r.get("inference")), (e2e - sum(parts.values())) / e2e, parts))
    if not checked:
        return None
    worst = max(checked, key=lambda c: abs(c[1]))
    shares = [abs(c[1]) for c in checked]
    return {
        "inferences": len(checked),
        "worst_residual_pct": 100 * abs(worst[1]),
        "worst_inference": worst[0],
        "median_residual_pct": 100 * statistics.median(shares),
        "over_tolerance": sum(1 for v in shares if v > TOLERANCE),
        "tolerance_pct": 100 * TOLERANCE,
        "adds_up": all(v <= TOLERANCE for v in shares),
        "source": "+".join(sorted(sources)),
        "parts_ms_median": {k: statistics.median(c[2][k] for c in checked) for k in PARTS},
        "held": None if held is None else {
            "source": "the lab's CPU pacer (holds.csv)",
            "inferences_held": sum(1 for c in checked if c[2]["held_ms"] > 0),
            "held_ms_max": max(c[2]["held_ms"] for c in checked)},
        "cpu_wait": {
            "source": "each sender thread's run-queue wait (/proc/thread-self/schedstat)",
            "inferences_waited": sum(1 for c in checked if c[2]["cpu_wait_ms"] > 0),
            "cpu_wait_ms_max": max(c[2]["cpu_wait_ms"] for c in checked)},
        "method": "residual = e2e - (edge compute + encode + transfer + decode + later "
                  "stages' compute + queue wait + held + CPU wait), per inference, as a "
                  "share of e2e; "
                  "stages: each part from the stage that timed it, one clock per "
                  "difference; held: the part of a sender's hand-off (compute end to "
                  "encode start) its lab host spent stopped by the lab's CPU pacer; CPU wait: "
                  "the part of that hand-off its thread was ready to run and waited for a "
                  "CPU (latency mode; the kernel's schedstat); "
                  "columns: the inferences.csv columns, whose transfer is e2e minus the "
                  "rest (closes by construction)",
    }


def run_budget(run_dir, rows: list[Mapping]) -> dict | None:
    """:func:`latency_budget` of a run directory's rows, its ``stages.csv`` and its
    ``holds.csv`` (each if any)."""
    holds = Path(run_dir) / HOLDS_FILE
    return latency_budget(rows, complete_rows(Path(run_dir) / STAGES_FILE),
                          read_holds_csv(holds) if holds.exists() else None)


def write_holds_csv(run_dir, rows: Iterable[Mapping]) -> Path:
    """Write ``holds.csv`` (atomically; :data:`HOLD_COLUMNS`)."""
    return atomic_csv(Path(run_dir) / HOLDS_FILE, HOLD_COLUMNS, rows)


def read_holds_csv(path) -> list[dict]:
    """The rows of a ``holds.csv``."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def warmup_count(warmup_rounds: int, n_splits: int, configs: int = 0) -> dict:
    """``summary.json["warmup"]``: the unrecorded inferences before measuring. The head
    runs ``warmup_rounds`` round trips at the first and the last split (one split: once),
    and a pipeline sweep two more before each configuration it measures."""
    ends = min(2, max(1, n_splits))
    return {"rounds": warmup_rounds, "inferences": warmup_rounds * ends + 2 * configs,
            "recorded": False,
            "method": f"{warmup_rounds} round trips at each end split before measuring, "
                      "and 2 before each pipeline configuration; none of them is in "
                      "inferences.csv or in any statistic"}
