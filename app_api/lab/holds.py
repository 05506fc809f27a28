"""The lab pacer's record of its holds: each stop of a lab host, from its SIGSTOP to its
SIGCONT (:mod:`app_api.lab.pacer`), on ``perf_counter``, the clock every lab host's
timers read, so a run can set them against its stages' times (``holds.csv``,
:mod:`app_api.results.budget`).

The file (:data:`HOLDS_FILE` in the lab's directory) is a header naming each host's
cgroup, then a text line per hold, written every :data:`HOLDS_FLUSH_S`. At
:data:`HOLDS_MAX_BYTES` it becomes ``<file>.1`` and a new one begins: with three busy
hosts stopped every few ms (~30 bytes a hold), the two keep the last 10-20 minutes, and a
run older than that is told where the record begins.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HOLDS_FILE = "pacer-holds.txt"  # in the lab's directory (lab up passes it as --holds)
HOLDS_FLUSH_S = 0.25  # how often the holds are written out
HOLDS_MAX_BYTES = 16 << 20  # a holds file this large is kept as <file>.1, and one begins


class HoldLog:
    """The holds file: a header naming each host's cgroup (``# host I DIR``), then one line
    ``I T_STOP T_CONT`` per hold (host index, ``perf_counter`` seconds), buffered and
    written every :data:`HOLDS_FLUSH_S`; rotated at :data:`HOLDS_MAX_BYTES`."""

    def __init__(self, path: Path | None, dirs: list[str]) -> None:
        self.path = path
        self.header = "".join(f"# host {i} {d}\n" for i, d in enumerate(dirs))
        self.lines: list[str] = []
        self.size = 0
        if path is not None:
            self._begin()

    def _begin(self) -> None:
        self.path.write_text(self.header)
        self.size = len(self.header)

    def add(self, host: int, t_stop: float, t_cont: float) -> None:
        if self.path is not None:
            self.lines.append(f"{host} {t_stop:.6f} {t_cont:.6f}\n")

    def flush(self) -> None:
        if self.path is None or not self.lines:
            return
        text = "".join(self.lines)
        self.lines.clear()
        try:
            if self.size + len(text) > HOLDS_MAX_BYTES:
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                self._begin()
            with open(self.path, "a") as f:
                f.write(text)
            self.size += len(text)
        except OSError as exc:  # the lab's directory gone: the pacer ends on its next check
            print(f"pacer: holds not written: {exc}", file=sys.stderr, flush=True)


def read_holds(path: Path) -> tuple[dict[int, str], list[tuple[int, float, float]]]:
    """``({index: cgroup dir}, [(index, t_stop, t_cont)])`` of a holds file and the one
    rotated before it (older first); empty where there are none."""
    dirs: dict[int, str] = {}
    holds: list[tuple[int, float, float]] = []
    for p in (path.with_name(path.name + ".1"), path):
        try:
            text = p.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            parts = line.split()
            if line.startswith("# host ") and len(parts) >= 4:
                dirs[int(parts[2])] = " ".join(parts[3:])
            elif len(parts) == 3 and not line.startswith("#"):
                try:
                    holds.append((int(parts[0]), float(parts[1]), float(parts[2])))
                except ValueError:  # a line cut short by a rotation or a crash
                    continue
    return dirs, holds
