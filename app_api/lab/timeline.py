"""The lab link's configured state against wall time, for matching results to conditions.

Whoever changes a link appends a JSON line to ``/run/tracr-lab/link-timeline.jsonl``: the
link emulator at its start, at each reconfiguration and at each step of a trace
(:class:`app_api.lab.emulator.Timeline`); ``tracr lab up`` / ``shape`` for the kernel's
mechanisms (tbf, netem). Each line: ``t`` (``time.time()``), ``link`` (host), ``dir``
(``up``: the host's egress, ``down``: its ingress), ``event`` (start, config, step),
``rate_Bps`` (None: unlimited), ``delay_ms``, ``jitter_ms``, ``loss`` (long-run
fraction), ``trace``, ``queue_bytes``/``queue_packets``, ``mechanism`` where known::

    from app_api.lab.timeline import link_timeline
    rows = link_timeline(run_start, run_end)   # the state at run_start, then each change
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from app_api.lab import state as lab_state

FILE = "link-timeline.jsonl"
FIELDS = ("t", "link", "dir", "event", "mechanism", "rate_Bps", "delay_ms", "jitter_ms",
          "loss", "trace", "queue_bytes", "queue_packets")


def timeline_path() -> Path:
    """Where the lab's timeline lives (inside the lab's root-owned directory)."""
    return lab_state.lab_dir() / FILE


def read_timeline(path: Path | None = None) -> list[dict]:
    """Every row of the timeline, oldest first ([] when there is none)."""
    try:
        text = (path or timeline_path()).read_text(errors="replace")
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash
        if isinstance(row, dict) and isinstance(row.get("t"), (int, float)):
            rows.append(row)
    return sorted(rows, key=lambda r: r["t"])


def append(rows: list[dict], path: Path | None = None) -> None:
    """Append ``rows`` (each gets ``t`` = now unless it has one)."""
    now = time.time()
    with open(path or timeline_path(), "a") as fh:
        for row in rows:
            fh.write(json.dumps({"t": now, **row}) + "\n")


def link_timeline(t0: float, t1: float, path: Path | None = None) -> list[dict]:
    """The links' configured state from ``t0`` to ``t1`` (wall times): for each (link,
    dir) the row in effect at ``t0`` (its ``t`` set to ``t0``), then every change up to
    ``t1``, sorted by time. A run writes these as ``link.csv``."""
    rows = read_timeline(path)
    current: dict[tuple, dict] = {}
    changes = []
    for row in rows:
        key = (row.get("link"), row.get("dir"))
        if row["t"] <= t0:
            current[key] = row
        elif row["t"] <= t1:
            changes.append(row)
    start = [{**row, "t": t0, "event": "in effect"} for row in current.values()]
    return [{k: r.get(k) for k in FIELDS} for r in start + changes]


def to_csv(rows: list[dict]) -> str:
    """``rows`` as CSV text, one column per field of :data:`FIELDS`."""
    import csv
    import io

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(FIELDS))
    writer.writeheader()
    for row in rows:
        writer.writerow({k: row.get(k) for k in FIELDS})
    return buf.getvalue()
