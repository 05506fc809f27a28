"""A run as pandas DataFrames, and its export to CSV, Parquet or JSON.

Worked example (after ``tracr experiment run alexnet-sweep``)::

    from app_api.results import load

    run = load("last")                  # or an experiment name, a run id, a directory
    run.inferences                      # one row per inference (inferences.csv)
    run.splits[["split", "layer", "e2e_ms_p50", "e2e_ms_ci95_lo", "e2e_ms_ci95_hi"]]
    run.layers.groupby(["instance", "name"])["ms"].median()   # per-layer time per device
    run.stages                          # one row per stage of each inference (may be empty)
    run.summary["latency_budget"]["worst_residual_pct"]
    fast = run.inferences.query("split == @run.summary['best_split']")["e2e_ms"]

    run.export("parquet")               # <run>/export/{inferences,layers,splits,stages}.parquet

pandas (and for Parquet pyarrow) are the ``export`` extra: ``pip install 'tracr[export]'``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from app_api.results.figstyle import load_envs
from app_api.results.store import (
    CONFIG_COLUMNS,
    CONFIGS_FILE,
    INFER_COLUMNS,
    LAYER_COLUMNS,
    STAGE_COLUMNS,
    STAGES_FILE,
    complete_rows,
    find_run,
    load_summary,
)
from experiment_design.errors import TracrError

#: the tables of a run, in export order
TABLES = ("inferences", "layers", "splits", "stages", "configs")
EXPORT_FORMATS = ("csv", "parquet", "json")
_HINT = "install the export extra: pip install 'tracr[export]' (pandas and pyarrow)"


def _pandas() -> Any:
    try:
        import pandas as pd
    except ImportError:
        raise TracrError("loading results as DataFrames needs pandas", hint=_HINT) from None
    return pd


class Run:
    """One run directory, read lazily: ``summary`` (dict), ``environment`` (dict),
    ``manifest`` (text) and the DataFrames ``inferences``, ``layers``, ``splits``,
    ``stages`` and ``configs`` (empty where the run has none)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.dir = Path(run_dir)

    def __repr__(self) -> str:
        return f"Run({str(self.dir)!r})"

    @functools.cached_property
    def summary(self) -> dict:
        """summary.json ({} when the run did not finish)."""
        return load_summary(self.dir) or {}

    @functools.cached_property
    def environment(self) -> dict:
        """environment.json: participant -> what it reported about itself."""
        return load_envs(self.dir)

    @functools.cached_property
    def manifest(self) -> str:
        """The resolved manifest (YAML text) the run ran."""
        path = self.dir / "manifest.yaml"
        return path.read_text() if path.exists() else ""

    def _csv(self, name: str, columns: list[str]) -> Any:
        pd = _pandas()
        path = self.dir / name
        if not path.exists() or path.stat().st_size == 0:
            return pd.DataFrame(columns=columns)

        # complete rows only: a run killed mid-write leaves a last line cut off
        return pd.DataFrame(complete_rows(path), columns=columns).pipe(_typed)

    @functools.cached_property
    def inferences(self) -> Any:
        """inferences.csv: one row per inference (failed ones with ``error`` set)."""
        return self._csv("inferences.csv", _header(self.dir / "inferences.csv", INFER_COLUMNS))

    @functools.cached_property
    def layers(self) -> Any:
        """layers.csv: one row per layer of each inference on the device that ran it."""
        return self._csv("layers.csv", _header(self.dir / "layers.csv", LAYER_COLUMNS))

    @functools.cached_property
    def stages(self) -> Any:
        """stages.csv: one row per stage of each inference (times on each stage's clock)."""
        return self._csv(STAGES_FILE, _header(self.dir / STAGES_FILE, STAGE_COLUMNS))

    @functools.cached_property
    def configs(self) -> Any:
        """configs.csv: one row per measured pipeline configuration."""
        return self._csv(CONFIGS_FILE, CONFIG_COLUMNS)

    @functools.cached_property
    def splits(self) -> Any:
        """summary.json's per-split statistics, one row per split; the interval as
        ``e2e_ms_ci95_lo`` / ``_hi``, and ``in_best_set``."""
        pd = _pandas()
        rows = []
        tied = set((self.summary.get("best_set") or {}).get("splits") or [])
        for s in self.summary.get("splits") or []:
            r = {k: v for k, v in s.items() if not isinstance(v, (list, dict))}
            ci = s.get("e2e_ms_ci95") or [None, None]
            r.update(e2e_ms_ci95_lo=ci[0], e2e_ms_ci95_hi=ci[1], in_best_set=s["split"] in tied)
            rows.append(r)
        return pd.DataFrame(rows)

    def tables(self) -> dict[str, Any]:
        """Every non-empty table by name (:data:`TABLES` order)."""
        out = {name: getattr(self, name) for name in TABLES}
        return {k: v for k, v in out.items() if len(v)}

    def export(self, fmt: str, out_dir: str | Path | None = None) -> list[Path]:
        """Write every non-empty table as ``<out_dir>/<table>.<fmt>`` (``csv``, ``parquet``
        or ``json``: records, one object per row) and ``summary.json`` beside them;
        ``out_dir`` defaults to ``<run>/export``. Returns the files written."""
        if fmt not in EXPORT_FORMATS:
            raise TracrError(f"unknown export format {fmt!r}",
                             hint=f"one of: {', '.join(EXPORT_FORMATS)}")
        if fmt == "parquet":
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise TracrError("parquet export needs pyarrow", hint=_HINT) from None
        out = Path(out_dir) if out_dir else self.dir / "export"
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, df in self.tables().items():
            path = out / f"{name}.{fmt}"
            if fmt == "csv":
                df.to_csv(path, index=False)
            elif fmt == "parquet":
                df.to_parquet(path, index=False)
            else:
                df.to_json(path, orient="records", indent=1)
            paths.append(path)
        summary = out / "summary.json"
        summary.write_text(json.dumps(self.summary, indent=2, default=str) + "\n")
        return [*paths, summary]


def _header(path: Path, default: list[str]) -> list[str]:
    """The columns a CSV file was written with (a run from an older tracr has fewer)."""
    import csv

    if not path.exists():
        return default
    with open(path, newline="") as f:
        return next(csv.reader(f), default) or default


def _typed(df: Any) -> Any:
    """Numbers where a column holds only numbers (and empty cells: NaN)."""
    pd = _pandas()
    for col in df.columns:
        vals = df[col].replace("", None)
        num = pd.to_numeric(vals, errors="coerce")
        if num.notna().sum() == vals.notna().sum():
            df[col] = num
    return df


def load(ref: str | Path = "last") -> Run:
    """The run ``ref`` names (``last``, an experiment's name, ``EXPERIMENT/last``, a run id
    or a directory, as ``tracr results show`` takes them) as a :class:`Run`."""
    return Run(find_run(str(ref)))
