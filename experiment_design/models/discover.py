"""Importing model modules from explicit folders (the registry discovers its own).

The model registry (:data:`experiment_design.models.registry.MODELS`) imports
every module of ``experiment_design/models/`` and ``experiment_design/models/user/``
on lookup, so a user drops a file using ``@register_model`` into either folder and
the model is available by name. :func:`import_model_modules` does the same for
other folders, e.g. a project's own models directory.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

from experiment_design.models.registry import MODELS
from experiment_design.registry import import_modules

log = logging.getLogger(__name__)


def import_model_modules(dirs: list[tuple[Path, str]] | None = None) -> list[str]:
    """Import model modules; return the names imported now. A broken module is logged,
    never fatal: one typo must not hide every other model.

    ``dirs`` is a list of (directory, package prefix) pairs; by default the
    model registry's own packages.
    """
    if dirs is None:
        dirs = [
            (Path(p), f"{name}.")
            for name in MODELS.packages
            for p in importlib.import_module(name).__path__
        ]
    imported: list[str] = []
    for sub, prefix in dirs:
        if not Path(sub).is_dir():
            continue
        ok, _failed = import_modules(prefix.rstrip("."), [str(sub)])  # logged there
        imported += ok
    return imported
