"""A user's own models, datasets, partitioners, roles and tasks, from their own package.

A package outside tracr's source tree registers its classes with tracr's decorators
(``@register_partitioner``, ``@register_model``, ...) in a module that tracr imports:

- every module named by an entry point of the group ``tracr.plugins`` of an installed
  distribution (``[project.entry-points."tracr.plugins"] mine = "mypkg.tracr_parts"``),
- and every module a manifest lists under ``plugins`` (``plugins: [mypkg.tracr_parts]``).

:func:`activate` names them in ``$TRACR_PLUGINS`` (the registries import them on lookup,
:mod:`experiment_design.registry`), so names are checked, with the same did-you-mean
errors, as a built-in's. Participants get the same list (``--plugins``); a device is sent
each plugin's package in the bundle, so it needs nothing installed.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterable

from experiment_design.errors import TracrError
from experiment_design.registry import PLUGINS_ENV, plugin_modules

GROUP = "tracr.plugins"


def entry_point_modules() -> list[str]:
    """The modules named by installed distributions' ``tracr.plugins`` entry points."""
    out = []
    for ep in importlib.metadata.entry_points(group=GROUP):
        module = ep.value.split(":", 1)[0].strip()
        if module:
            out.append(module)
    return out


def activate(extra: Iterable[str] = ()) -> list[str]:
    """Add the entry points' modules and ``extra`` (a manifest's ``plugins``) to
    ``$TRACR_PLUGINS`` and import them now; the full list. A plugin that fails to
    import is an error naming it."""
    wanted = list(dict.fromkeys([*plugin_modules(), *entry_point_modules(), *extra]))
    os.environ[PLUGINS_ENV] = ",".join(wanted)
    for module in wanted:
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise TracrError(f"could not import the plugin {module}: {type(exc).__name__}: {exc}",
                             hint="a plugin is a module of your own package, importable here "
                             "(installed, or on PYTHONPATH); tracr imports it to find what it "
                             "registers") from exc
    return wanted
