"""Auto-import of every module under ``experiment_design/models/`` (and ``user/``).

A user drops a file using ``@register_model`` into ``experiment_design/models/``
or ``experiment_design/models/user/`` and the model is available by name.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from pathlib import Path

log = logging.getLogger(__name__)

_SKIP = {"registry", "discover", "weights", "__init__"}


def import_model_modules(dirs: list[tuple[Path, str]] | None = None) -> list[str]:
    """Import model modules; a broken user module is logged, never fatal.

    ``dirs`` is a list of (directory, package prefix) pairs; by default
    ``experiment_design/models/`` and ``experiment_design/models/user/``.
    """
    import experiment_design.models as pkg

    base = Path(pkg.__file__).parent
    if dirs is None:
        dirs = [
            (base, "experiment_design.models."),
            (base / "user", "experiment_design.models.user."),
        ]
    imported = []
    for sub, prefix in dirs:
        if not Path(sub).is_dir():
            continue
        for info in sorted(pkgutil.iter_modules([str(sub)]), key=lambda i: i.name):
            if info.name in _SKIP or info.name.startswith("_") or info.ispkg:
                continue
            name = prefix + info.name
            try:
                importlib.import_module(name)
                imported.append(name)
            except Exception as exc:  # a user's typo must not hide every other model
                log.warning("could not import model module %s: %s", name, exc)
    return imported
