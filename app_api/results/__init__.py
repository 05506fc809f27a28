"""The results store (run directories, CSV rows, summary.json) and plots."""

from __future__ import annotations

from app_api.results.store import (
    INFER_COLUMNS,
    LAYER_COLUMNS,
    ResultsWriteError,
    RunWriter,
    claim_run_dir,
    complete_rows,
    find_run,
    list_runs,
    load_summary,
    new_run_id,
    prepare_resume,
    read_csv,
    results_root,
    safe_cell,
)
from app_api.results.summary import best_split, build_summary, split_stats

__all__ = [
    "INFER_COLUMNS", "LAYER_COLUMNS", "ResultsWriteError", "RunWriter", "best_split",
    "build_summary", "claim_run_dir", "complete_rows", "find_run", "list_runs", "load_summary",
    "new_run_id", "prepare_resume", "read_csv", "results_root", "safe_cell", "split_stats",
]
