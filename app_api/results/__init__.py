"""The results store (run directories, CSV rows, summary.json) and plots."""

from __future__ import annotations

from app_api.results.store import (
    INFER_COLUMNS,
    LAYER_COLUMNS,
    RunWriter,
    find_run,
    list_runs,
    load_summary,
    new_run_id,
    read_csv,
    results_root,
)
from app_api.results.summary import best_split, build_summary, split_stats

__all__ = [
    "INFER_COLUMNS", "LAYER_COLUMNS", "RunWriter", "best_split", "build_summary", "find_run",
    "list_runs", "load_summary", "new_run_id", "read_csv", "results_root", "split_stats",
]
