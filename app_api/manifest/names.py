"""Lookups of the names a manifest may use, asked of each registry lazily.

Each registry lives in a different part of tracr. A registry module that does
not exist (an install without it) skips its check; any other error while
importing it is a real bug and propagates.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

LOCALHOST = "localhost"
TORCHVISION_PREFIX = "torchvision:"


def _missing_module(exc: ModuleNotFoundError, module: str) -> bool:
    """True when ``exc`` says ``module`` itself (or a parent package) does not exist."""
    name = exc.name or ""
    return bool(name) and (module == name or module.startswith(name + "."))


def registry_names(module: str, func: str) -> list[str] | None:
    """``module.func()`` as a list of names, or None when that registry is not installed."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if _missing_module(exc, module):
            log.debug("registry %s not available; skipping its check", module)
            return None
        raise
    fn: Callable[[], list[str]] | None = getattr(mod, func, None)
    if fn is None:
        log.debug("registry %s has no %s(); skipping its check", module, func)
        return None
    return list(fn())


def roles() -> list[str] | None:
    """Registered participant roles."""
    return registry_names("experiment_design.roles", "list_roles")


def tasks() -> list[str] | None:
    """Registered tasks."""
    return registry_names("experiment_design.tasks", "list_tasks")


def partitioners() -> list[str] | None:
    """Registered partitioners."""
    return registry_names("experiment_design.partitioners", "list_partitioners")


def datasets() -> list[str] | None:
    """Registered datasets (built-ins plus modules in MyDatasets/)."""
    return registry_names("MyDatasets", "list_datasets")


def dataset_params(name: str) -> list[str] | None:
    """Parameters dataset ``name`` accepts, or None for any."""
    mod = importlib.import_module("MyDatasets")
    accepted = getattr(mod, "accepted_params", None)
    return accepted(name) if accepted is not None else None


def dataset_required_params(name: str) -> list[str]:
    """Parameters dataset ``name`` cannot do without."""
    mod = importlib.import_module("MyDatasets")
    required = getattr(mod, "required_params", None)
    return required(name) if required is not None else []


def models() -> list[str] | None:
    """Registered model names (``torchvision:<name>`` is checked separately)."""
    return registry_names("experiment_design.models", "list_models")


def torchvision_models() -> list[str] | None:
    """Classification model names torchvision knows, or None without torchvision."""
    try:
        import torchvision.models as tvm
    except ModuleNotFoundError:
        return None
    return list(tvm.list_models(module=tvm))


def devices() -> list[str] | None:
    """Paired device names plus ``localhost``, or None without the device registry."""
    try:
        reg_mod = importlib.import_module("app_api.devices.registry")
    except ModuleNotFoundError as exc:
        if _missing_module(exc, "app_api.devices.registry"):
            return None
        raise
    cls = getattr(reg_mod, "DeviceRegistry", None)
    if cls is None:
        return None
    # load() may be a classmethod returning a registry or an instance method filling one.
    if isinstance(inspect.getattr_static(cls, "load", None), (classmethod, staticmethod)):
        reg = cls.load()
    else:
        reg = cls()
        loaded = reg.load()
        reg = loaded if loaded is not None else reg
    names = reg.names() if hasattr(reg, "names") else []
    return sorted(set(names) | {LOCALHOST})
