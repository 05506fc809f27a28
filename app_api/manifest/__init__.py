"""Experiment manifests: finding, loading, overriding and validating them.

An experiment is one YAML file (``manifests/NAME.yaml``); its name is the file
name. :func:`load_manifest` applies ``--set`` overrides (Hydra grammar) and
validates everything (keys, types, and every role/task/partitioner/model/
dataset/device name against its registry) before anything starts, raising one
:class:`ManifestError` that names the file, the key path and the line.

This package is imported by the CLI at start-up, so the names below are
loaded lazily: ``import app_api.manifest`` costs nothing until it is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ManifestError": "app_api.manifest.errors",
    "Manifest": "app_api.manifest.manifest",
    "load_manifest": "app_api.manifest.manifest",
    "validate_data": "app_api.manifest.manifest",
    "find_manifest": "app_api.manifest.search",
    "list_manifests": "app_api.manifest.search",
    "search_dirs": "app_api.manifest.search",
    "apply_overrides": "app_api.manifest.overrides",
    "new_manifest_text": "app_api.manifest.template",
    "parse_bandwidth": "app_api.manifest.units",
    "register_manifest_commands": "app_api.manifest.commands",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'app_api.manifest' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
