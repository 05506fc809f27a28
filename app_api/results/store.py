"""The results store: one directory per run, CSV rows streamed, summary written last."""

from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import secrets
from pathlib import Path
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.protocol import INFER_COLUMNS, LAYER_COLUMNS

__all__ = ["INFER_COLUMNS", "LAYER_COLUMNS", "RunWriter", "find_run", "list_runs",
           "load_summary", "new_run_id", "read_csv", "results_root"]


def results_root() -> Path:
    """``$TRACR_RESULTS_DIR`` or ``./results``."""
    return Path(os.environ.get("TRACR_RESULTS_DIR") or "results")


def new_run_id(now: _dt.datetime | None = None) -> str:
    """UTC timestamp plus a short random suffix: sortable and unique."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    # milliseconds keep two runs started in the same second in order
    return now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z-" + secrets.token_hex(3)


class RunWriter:
    """Writes one run directory; CSV rows are appended (and flushed) as they arrive."""

    def __init__(self, experiment: str, out_dir: str | os.PathLike | None = None,
                 run_id: str | None = None) -> None:
        self.experiment = experiment
        self.run_id = run_id or new_run_id()
        self.dir = Path(out_dir) if out_dir else results_root() / experiment / self.run_id
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TracrError(f"cannot create the results directory {self.dir}: {exc}") from exc
        self._files: dict[str, Any] = {}
        self._writers: dict[str, csv.DictWriter] = {}
        for name, cols in (("inferences.csv", INFER_COLUMNS), ("layers.csv", LAYER_COLUMNS)):
            f = open(self.dir / name, "w", newline="")  # noqa: SIM115 - closed in close()
            w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            self._files[name], self._writers[name] = f, w
        self.rows: list[dict] = []
        self.n_layers = 0

    def add_inferences(self, rows: list[dict]) -> None:
        """Append inference rows."""
        if not rows:
            return
        self._writers["inferences.csv"].writerows(rows)
        self._files["inferences.csv"].flush()
        self.rows.extend(rows)

    def add_layers(self, rows: list[dict]) -> None:
        """Append per-layer rows."""
        if not rows:
            return
        self._writers["layers.csv"].writerows(rows)
        self.n_layers += len(rows)

    def write_json(self, name: str, data: Any) -> Path:
        """Write ``name`` as indented JSON."""
        path = self.dir / name
        path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
        return path

    def write_text(self, name: str, text: str) -> Path:
        """Write a text file (the resolved manifest)."""
        path = self.dir / name
        path.write_text(text)
        return path

    def close(self) -> None:
        """Flush and close the CSV files."""
        for f in self._files.values():
            try:
                f.close()
            except OSError:
                pass


def list_runs(root: Path | None = None) -> list[dict]:
    """Every run under the results root: experiment, run_id, dir, summary (if written).
    Sorted oldest first by run id (its timestamp)."""
    root = root or results_root()
    out = []
    if not root.is_dir():
        return out
    for exp in sorted(p for p in root.iterdir() if p.is_dir()):
        for run in sorted(p for p in exp.iterdir() if p.is_dir()):
            summary = load_summary(run)
            if summary is None and (run / "group.json").exists():
                summary = _group_as_summary(run)
            out.append({"experiment": exp.name, "run_id": run.name, "dir": run,
                        "summary": summary})
    out.sort(key=lambda r: r["run_id"])
    return out


def _group_as_summary(group_dir: Path) -> dict | None:
    """A bandwidth group's ``group.json`` in the shape ``tracr results ls`` lists."""
    try:
        g = json.loads((group_dir / "group.json").read_text())
    except (OSError, ValueError):
        return None
    rows = g.get("rows") or []
    return {"kind": "group", "status": g.get("status"), "wall_s": g.get("wall_s"),
            "inferences": f"{len(rows)} runs",
            "best_split": " ".join(f"{r.get('bandwidth')}:{r.get('best')}" for r in rows)}


def load_summary(run_dir: Path) -> dict | None:
    """summary.json of a run directory, or None when missing/unreadable."""
    try:
        return json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def find_run(ref: str, root: Path | None = None) -> Path:
    """Resolve ``last``, a run id, ``experiment/run-id``, an experiment name (its latest
    run) or a directory path to a run directory."""
    p = Path(ref)
    if ref not in ("last",) and ((p / "summary.json").exists() or (p / "group.json").exists()):
        return p
    runs = list_runs(root)
    if ref == "last":
        if not runs:
            raise TracrError("No runs yet.", hint="run one with `tracr experiment run NAME`")
        return runs[-1]["dir"]
    matches = [r for r in runs if r["run_id"] == ref or f"{r['experiment']}/{r['run_id']}" == ref
               or r["run_id"].startswith(ref)]
    if not matches:
        matches = [r for r in runs if r["experiment"] == ref]
    if not matches:
        from experiment_design.errors import UnknownNameError

        raise UnknownNameError("run", ref, [r["run_id"] for r in runs] + ["last"],
                               hint="see `tracr results ls`")
    return matches[-1]["dir"]


def read_csv(path: Path) -> list[dict]:
    """Rows of a CSV file as dicts of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
