"""The results store (run directories, CSV rows, summary.json), Pareto fronts and plots."""

from __future__ import annotations

from app_api.results.frames import Run, load
from app_api.results.pareto import (
    DEFAULT_OBJECTIVES,
    OBJECTIVES,
    ParetoGroup,
    pareto_front,
    parse_objectives,
)
from app_api.results.store import (
    CONFIG_COLUMNS,
    CONFIG_MODES,
    CONFIGS_FILE,
    INFER_COLUMNS,
    LAYER_COLUMNS,
    ResultsWriteError,
    RunWriter,
    claim_run_dir,
    complete_rows,
    config_label,
    find_run,
    list_runs,
    load_summary,
    new_run_id,
    prepare_resume,
    read_configs,
    read_csv,
    read_group_configs,
    results_root,
    safe_cell,
)
from app_api.results.summary import best_split, build_summary, split_stats

__all__ = [
    "CONFIGS_FILE", "CONFIG_COLUMNS", "CONFIG_MODES", "DEFAULT_OBJECTIVES", "INFER_COLUMNS",
    "LAYER_COLUMNS", "OBJECTIVES", "ParetoGroup", "ResultsWriteError", "Run", "RunWriter",
    "best_split",
    "build_summary", "claim_run_dir", "complete_rows", "config_label", "find_run", "list_runs",
    "load", "load_summary", "new_run_id", "pareto_front", "parse_objectives", "prepare_resume",
    "read_configs", "read_group_configs", "read_csv", "results_root", "safe_cell", "split_stats",
]
