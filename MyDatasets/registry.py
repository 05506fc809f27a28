"""The dataset registry: ``@register_dataset``, ``create_dataset``, ``list_datasets``.

The registry lives in :mod:`experiment_design.datasets` (it imports every module
of this package on lookup, so a new ``MyDatasets/my_data.py`` with
``@register_dataset("my-data")`` needs no other wiring); these are its names,
re-exported for dataset modules and existing imports.
"""

from __future__ import annotations

from experiment_design.datasets import (
    DATASETS,
    accepted_params,
    create_dataset,
    get_dataset_class,
    list_datasets,
    register_dataset,
    required_params,
)

__all__ = [
    "DATASETS",
    "accepted_params",
    "create_dataset",
    "get_dataset_class",
    "list_datasets",
    "register_dataset",
    "required_params",
]
