"""The results store: one directory per run, CSV rows streamed, summary written last.

Crash-safe: CSV rows reach the file as they arrive (a killed run keeps every
completed row), every other file is replaced atomically (never seen half
written), a directory that already holds a run is never written over, and a
write that fails (a full disk) raises :class:`ResultsWriteError` so the run
stops and says why. Text cells are escaped against spreadsheet formulas (the CSV
files themselves: :mod:`app_api.results.csvfile`).
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import os
import secrets
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app_api.fsutil import atomic_write, user_owned
from app_api.results.csvfile import (
    CsvStream,
    ResultsWriteError,
    complete_rows,
    csv_text,
    read_csv,
    safe_cell,
)
from experiment_design.errors import TracrError, UnknownNameError
from experiment_design.protocol import (
    CONFIG_COLUMNS,
    INFER_COLUMNS,
    LAYER_COLUMNS,
    STAGE_COLUMNS,
    ConfigRecord,
)

# the records' columns are the protocol's (experiment_design.protocol.records), named here too
__all__ = ["CONFIGS_FILE", "CONFIG_COLUMNS", "CONFIG_MODES", "INFER_COLUMNS", "LAYER_COLUMNS",
           "STAGE_COLUMNS",
           "ResultsWriteError", "RunWriter", "claim_run_dir", "complete_rows", "config_label",
           "find_run", "list_runs", "load_summary", "new_run_id", "prepare_resume", "read_configs",
           "read_csv", "results_root", "safe_cell"]


def results_root() -> Path:
    """``$TRACR_RESULTS_DIR`` or ``./results``."""
    return Path(os.environ.get("TRACR_RESULTS_DIR") or "results")


def new_run_id(now: _dt.datetime | None = None) -> str:
    """UTC timestamp plus a short random suffix: sortable and unique."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    # milliseconds keep two runs started in the same second in order
    return now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z-" + secrets.token_hex(3)


RESUME_FILE = "resume.json"
CONFIGS_FILE = "configs.csv"
#: files whose presence makes a directory a run directory (never written over)
RUN_FILES = ("summary.json", "inferences.csv", "layers.csv", "manifest.yaml", "group.json",
             CONFIGS_FILE)

STAGES_FILE = "stages.csv"
#: throughput: several inferences in flight; latency: one at a time; single: one participant,
#: no cut (the baseline a chain is compared with)
CONFIG_MODES = ("throughput", "latency", "single")
#: how configs.csv's number columns read back: as ConfigRecord declares them
_CONFIG_INTS = frozenset(k for k, t in typing.get_type_hints(ConfigRecord).items() if t is int)
_CONFIG_FLOATS = frozenset(k for k, t in typing.get_type_hints(ConfigRecord).items()
                           if t is float)
#: the label of a configuration with no cut (the whole model on one participant)
UNSPLIT = "unsplit"


def claim_run_dir(path: Path) -> None:
    """Create ``path`` for a new run; refuse (exit 2) one that already holds anything, so a
    previous run is never written over."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise TracrError(f"{path} exists and is not a directory: not a place for a run.",
                         hint="choose another --out")
    if path.is_dir() and any(path.iterdir()):
        what = "a run" if any((path / f).exists() for f in RUN_FILES) else "files"
        raise TracrError(
            f"{path} already holds {what}; tracr never writes over a previous run.",
            hint="choose another --out (or leave --out off: each run gets a fresh directory); "
                 "to continue an incomplete run use --resume",
        )
    created = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TracrError(f"cannot create the results directory {path}: {exc}") from exc
    for p in created:  # under sudo, results/<experiment>/ too stay the user's
        user_owned(p)


class RunWriter:
    """Writes one run directory: CSV rows appended (and flushed) as they arrive, every
    other file written atomically. A directory that already holds anything is refused,
    except one :func:`prepare_resume` made (it carries the rows of the run resumed)."""

    def __init__(self, experiment: str, out_dir: str | os.PathLike | None = None,
                 run_id: str | None = None) -> None:
        self.experiment = experiment
        self.run_id = run_id or new_run_id()
        self.dir = Path(out_dir) if out_dir else results_root() / experiment / self.run_id
        self.rows: list[dict] = []
        self.n_layers = 0
        #: the run this one continues ({"run_id", "dir", "rows"}), or None
        self.resumed_from: dict | None = None
        #: the first write that failed (the run stops; summary.json says why)
        self.failure: ResultsWriteError | None = None
        self._offset = 0
        resume = _prepared_resume(self.dir)
        if resume is None:
            claim_run_dir(self.dir)
        else:
            self.resumed_from = resume
            # as read back: text, and None where a cell is empty (a failed row's timings)
            self.rows = [{k: (v if v != "" else None) for k, v in r.items()}
                         for r in read_csv(self.dir / "inferences.csv")]
            self.n_layers = len(read_csv(self.dir / "layers.csv"))
            # inference numbers stay unique across both runs: the new ones follow on
            self._offset = 1 + max((int(_num_or(r.get("inference"), -1)) for r in self.rows),
                                   default=-1)
        fresh = resume is None
        self._streams = {
            "inferences.csv": CsvStream(self.dir / "inferences.csv", INFER_COLUMNS, fresh),
            "layers.csv": CsvStream(self.dir / "layers.csv", LAYER_COLUMNS, fresh),
        }

    def _append(self, name: str, rows: list[dict]) -> None:
        if self.failure is not None:
            raise self.failure
        try:
            if name in (CONFIGS_FILE, STAGES_FILE) and name not in self._streams:
                # only a pipeline sweep has them: configs.csv is what `tracr results pareto` reads
                cols = CONFIG_COLUMNS if name == CONFIGS_FILE else STAGE_COLUMNS
                self._streams[name] = CsvStream(self.dir / name, cols, fresh=True)
            self._streams[name].append(rows)
        except ResultsWriteError as exc:
            self.failure = exc
            raise

    def _renumber(self, rows: list[dict]) -> list[dict]:
        if not self._offset:
            return rows
        out = []
        for r in rows:
            r = dict(r)
            if isinstance(r.get("inference"), int):
                r["inference"] += self._offset
            out.append(r)
        return out

    def add_inferences(self, rows: list[dict]) -> None:
        """Append inference rows (on disk before this returns; ResultsWriteError if not)."""
        if not rows:
            return
        rows = self._renumber(rows)
        self._append("inferences.csv", rows)
        self.rows.extend(rows)

    def add_layers(self, rows: list[dict]) -> None:
        """Append per-layer rows."""
        if not rows:
            return
        self._append("layers.csv", self._renumber(rows))
        self.n_layers += len(rows)

    def add_configs(self, rows: list[dict]) -> None:
        """Append configuration rows to ``configs.csv`` (created with the first one), each
        on disk before this returns. ``cuts`` and ``chain`` may be sequences (joined with
        ``;``); ``config`` is derived from ``cuts``. A key that is not a column, or an unknown
        mode, is a ValueError: a typo must not leave a column silently empty."""
        if rows:
            self._append(CONFIGS_FILE, [_config_cells(r) for r in rows])

    def add_stages(self, rows: list[dict]) -> None:
        """Append per-stage rows of chain inferences to ``stages.csv`` (created with the first)."""
        if rows:
            self._append(STAGES_FILE, self._renumber(rows))

    def write_json(self, name: str, data: Any) -> Path:
        """Write ``name`` as indented JSON, atomically (ResultsWriteError if it cannot)."""
        return self.write_text(name, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")

    def write_text(self, name: str, text: str) -> Path:
        """Write a text file (the resolved manifest) atomically."""
        path = self.dir / name
        try:
            return atomic_write(path, text)
        except OSError as exc:
            raise ResultsWriteError(path, exc) from None

    def close(self) -> None:
        """Close the CSV files (their rows are on disk already)."""
        for s in self._streams.values():
            s.close()


def config_label(cuts: Sequence[int]) -> str:
    """A configuration's name: its cut points joined by ``/`` (``8/40``); ``unsplit`` for none."""
    return "/".join(str(int(c)) for c in cuts) or UNSPLIT


def _config_cells(row: dict) -> dict:
    """A configs.csv row as written: lists joined, ``config`` derived and checked."""
    unknown = sorted(set(row) - set(CONFIG_COLUMNS))
    if unknown:
        raise ValueError(f"not configs.csv columns: {', '.join(unknown)}")
    if row.get("mode") not in CONFIG_MODES:
        raise ValueError(f"mode must be one of {', '.join(CONFIG_MODES)}, "
                         f"not {row.get('mode')!r}")
    out = dict(row)
    cuts = row.get("cuts") or []
    if isinstance(cuts, str):
        cuts = [c for c in cuts.split(";") if c]
    cuts = [int(c) for c in cuts]
    out["cuts"] = ";".join(map(str, cuts))
    chain = row.get("chain") or []
    out["chain"] = chain if isinstance(chain, str) else ";".join(map(str, chain))
    label = config_label(cuts)
    if row.get("config") not in (None, label):
        raise ValueError(f"config {row['config']!r} is not the label of cuts {cuts}: {label!r}")
    out["config"] = label
    return out


def read_configs(path: str | os.PathLike) -> list[dict]:
    """The rows of ``configs.csv`` (a run directory or the file), typed: ``cuts`` a list of
    ints, ``chain`` a list of names, counts ints, measurements floats, an empty cell None
    (an unshaped ``bandwidth`` too); text as written (formula-escaped). A last row cut off
    by a crash is left out; a cell that is not the number its column holds is a TracrError
    naming the line; no configs.csv is a FileNotFoundError."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIGS_FILE
    if not path.is_file():
        raise FileNotFoundError(errno.ENOENT, "no configs.csv", str(path))
    out = []
    for line, raw in enumerate(complete_rows(path), start=2):
        row: dict[str, Any] = {}
        for col, text in raw.items():
            if col is None:  # more cells than the header names
                raise TracrError(f"{path}:{line}: more cells than columns")
            row[col] = _typed_cell(col, text, path, line)
        for col in CONFIG_COLUMNS:
            row.setdefault(col, [] if col in ("cuts", "chain") else None)
        out.append(row)
    return out


def read_group_configs(group_dir: str | os.PathLike, group: dict) -> list[dict]:
    """The configurations of every run of a bandwidth group (its ``group.json``, loaded),
    as :func:`read_configs` returns them, each labelled with its run's rate when the run
    did not record one; [] when no run of the group measured configurations."""
    out: list[dict] = []
    for member in group.get("rows") or []:
        run_dir = Path(group_dir) / str(member.get("run") or "")
        if not (run_dir / CONFIGS_FILE).is_file():
            continue
        for row in read_configs(run_dir):
            row["bandwidth"] = row.get("bandwidth") or member.get("bandwidth")
            out.append(row)
    return out


def _typed_cell(col: str, text: str | None, path: Path, line: int) -> Any:
    if col in ("cuts", "chain"):
        parts = [p for p in (text or "").split(";") if p]
        if col == "chain":
            return parts
        try:
            return [int(p) for p in parts]
        except ValueError:
            raise TracrError(f"{path}:{line}: cuts {text!r} are not integers") from None
    if text is None or text == "":
        return None
    if col not in _CONFIG_INTS and col not in _CONFIG_FLOATS:
        return text
    try:
        value = float(text)
    except ValueError:
        raise TracrError(f"{path}:{line}: {col} {text!r} is not a number") from None
    if col in _CONFIG_INTS:
        if not value.is_integer():
            raise TracrError(f"{path}:{line}: {col} {text!r} is not a whole number")
        return int(value)
    return value


def _num_or(v: Any, default: float) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def _prepared_resume(path: Path) -> dict | None:
    """The resume note of a directory :func:`prepare_resume` made and no run used yet."""
    note = path / RESUME_FILE
    if not note.is_file() or (path / "manifest.yaml").exists() or (path / "summary.json").exists():
        return None
    try:
        data = json.loads(note.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def prepare_resume(source: Path, experiment: str, out_dir: str | os.PathLike | None = None,
                   run_id: str | None = None) -> Path:
    """A fresh run directory holding the complete rows of the incomplete run ``source``
    (kept as they were measured) and a ``resume.json`` note; the next :class:`RunWriter`
    on it appends the rest. ``source`` itself is never written to."""
    source = Path(source)
    run_id = run_id or new_run_id()
    dest = Path(out_dir) if out_dir else results_root() / experiment / run_id
    claim_run_dir(dest)
    infer = complete_rows(source / "inferences.csv")
    layers = complete_rows(source / "layers.csv")
    try:
        atomic_write(dest / "inferences.csv", csv_text(infer, INFER_COLUMNS, header=True))
        atomic_write(dest / "layers.csv", csv_text(layers, LAYER_COLUMNS, header=True))
        note = {"run_id": source.name, "dir": str(source.resolve()), "rows": len(infer)}
        atomic_write(dest / RESUME_FILE, json.dumps(note, indent=2) + "\n")
    except OSError as exc:
        raise ResultsWriteError(dest, exc) from None
    return dest


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


GROUP_FILE = "group.json"  # a bandwidth group's summary, in the group's directory


def write_group(group_dir: Path, doc: dict) -> Path:
    """Write ``group.json``."""
    path = group_dir / GROUP_FILE
    atomic_write(path, json.dumps(doc, indent=2, default=str) + "\n")
    return path


def load_group(path: str | Path) -> dict | None:
    """``group.json`` of a group directory, or None."""
    try:
        return json.loads((Path(path) / GROUP_FILE).read_text())
    except (OSError, ValueError):
        return None


def load_summary(run_dir: Path) -> dict | None:
    """summary.json of a run directory, or None when missing/unreadable."""
    try:
        data = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def find_run(ref: str, root: Path | None = None) -> Path:
    """Resolve ``last``, a run id, ``experiment/run-id``, ``experiment/last`` or an
    experiment name (its latest run), or a directory path to a run directory."""
    p = Path(ref)
    if ref not in ("last",) and p.is_dir() and any((p / f).exists() for f in RUN_FILES):
        return p
    runs = list_runs(root)
    experiment = ref[: -len("/last")] if ref.endswith("/last") else None
    if experiment is not None:
        runs, ref = [r for r in runs if r["experiment"] == experiment], "last"
    if ref == "last":
        if not runs and experiment is not None:
            raise TracrError(f"No runs of {experiment!r} yet.",
                             hint=f"run one with `tracr experiment run {experiment}`, "
                             "or see `tracr results ls`")
        if not runs:
            raise TracrError("No runs yet.", hint="run one with `tracr experiment run NAME`")
        return runs[-1]["dir"]
    matches = [r for r in runs if r["run_id"] == ref or f"{r['experiment']}/{r['run_id']}" == ref
               or r["run_id"].startswith(ref)]
    if not matches:
        matches = [r for r in runs if r["experiment"] == ref]
    if not matches:
        raise UnknownNameError("run", ref, [r["run_id"] for r in runs] + ["last"],
                               hint="see `tracr results ls`")
    return matches[-1]["dir"]
