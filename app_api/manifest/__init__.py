"""Experiment manifests: finding, loading, overriding and validating them.

An experiment is one YAML file (``manifests/NAME.yaml``); its name is the file
name. :func:`load_manifest` applies ``--set`` overrides (Hydra grammar, parsed
once into :class:`Override` objects) and validates everything (keys, types,
and every role/task/partitioner/model/dataset/device name against its
registry) before anything starts, raising one :class:`ManifestError` that
names the file, the key path and the line.
"""

from __future__ import annotations

from app_api.manifest.errors import ManifestError
from app_api.manifest.manifest import Manifest, derive_manifest, load_manifest, validate_data
from app_api.manifest.overrides import Override, OverrideKind, apply_overrides, parse_overrides
from app_api.manifest.search import find_manifest, list_manifests, search_dirs
from app_api.manifest.template import new_manifest_text, write_new_manifest

__all__ = [
    "Manifest",
    "ManifestError",
    "Override",
    "OverrideKind",
    "apply_overrides",
    "derive_manifest",
    "find_manifest",
    "list_manifests",
    "load_manifest",
    "new_manifest_text",
    "parse_overrides",
    "search_dirs",
    "validate_data",
    "write_new_manifest",
]
