"""Import every module of a package so its registry decorators run."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys

log = logging.getLogger(__name__)


def import_submodules(package: str) -> list[str]:
    """Import each not-yet-imported module of ``package``; return the names imported now.

    Cheap to call repeatedly (a directory listing), so a module a user drops
    into the package is found by name without editing any registry.
    """
    pkg = sys.modules.get(package) or importlib.import_module(package)
    loaded = []
    for mod in pkgutil.iter_modules(pkg.__path__):
        full = f"{package}.{mod.name}"
        if mod.name.startswith("_") or full in sys.modules:
            continue
        try:
            importlib.import_module(full)
            loaded.append(full)
        except ImportError as exc:  # an optional dependency of that module is missing
            log.warning("module %s not loaded: %s", full, exc)
    return loaded
