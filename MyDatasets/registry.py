"""The dataset registry: ``@register_dataset``, ``create_dataset``, ``list_datasets``.

Every module in the ``MyDatasets`` package (built-ins and user modules alike)
is imported the first time the registry is asked for names, so a new
``MyDatasets/my_data.py`` with ``@register_dataset("my-data")`` needs no
other wiring.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiment_design.errors import TracrError, UnknownNameError
from MyDatasets.base import Dataset

log = logging.getLogger(__name__)

_REGISTRY: dict[str, type[Dataset]] = {}
_INFRASTRUCTURE = {"base", "registry", "preprocess"}
_discovered = False


def register_dataset(name: str) -> Callable[[type[Dataset]], type[Dataset]]:
    """Class decorator: make a :class:`Dataset` subclass available under ``name``."""

    def deco(cls: type[Dataset]) -> type[Dataset]:
        if not (isinstance(cls, type) and issubclass(cls, Dataset)):
            raise TypeError(f"@register_dataset({name!r}) needs a Dataset subclass, got {cls!r}")
        old = _REGISTRY.get(name)
        if old is not None and old.__qualname__ != cls.__qualname__:
            raise TracrError(
                f"Dataset name '{name}' is registered twice: by {old.__module__}.{old.__qualname__} "
                f"and {cls.__module__}.{cls.__qualname__}.",
                hint="Rename one of them.",
            )
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def _discover() -> None:
    """Import every module of the package once, so their decorators run."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    import MyDatasets

    # The package path, not this file's folder, so an extended __path__ is searched too.
    found = pkgutil.iter_modules(list(MyDatasets.__path__))
    for info in sorted(found, key=lambda m: m.name):
        if info.name.startswith("_") or info.name in _INFRASTRUCTURE:
            continue
        modname = f"MyDatasets.{info.name}"
        try:
            importlib.import_module(modname)
        except ImportError as exc:
            _discovered = False
            raise TracrError(
                f"Could not import dataset module {modname}: {exc}",
                hint=f"Fix or remove {Path(info.module_finder.path) / (info.name + '.py')}.",
            ) from exc


def list_datasets() -> list[str]:
    """Names of every registered dataset, sorted."""
    _discover()
    return sorted(_REGISTRY)


def get_dataset_class(name: str) -> type[Dataset]:
    """The class registered as ``name``; an unknown name lists the valid ones."""
    _discover()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownNameError("dataset", name, _REGISTRY) from None


def accepted_params(name_or_cls: str | type[Dataset]) -> list[str] | None:
    """Parameter names a dataset accepts, or None when it takes any (``**params``)."""
    cls = get_dataset_class(name_or_cls) if isinstance(name_or_cls, str) else name_or_cls
    sig = inspect.signature(cls.__init__)
    names = []
    for p in list(sig.parameters.values())[1:]:
        if p.kind is p.VAR_KEYWORD:
            return None
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in (
            "input_shape",
            "seed",
        ):
            names.append(p.name)
    return names


def required_params(name_or_cls: str | type[Dataset]) -> list[str]:
    """Parameters a dataset cannot do without (keyword parameters with no default)."""
    cls = get_dataset_class(name_or_cls) if isinstance(name_or_cls, str) else name_or_cls
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return [
        p.name
        for p in params
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        and p.default is p.empty
        and p.name not in ("input_shape", "seed")
    ]


def create_dataset(
    name: str, *, input_shape: tuple[int, ...], seed: int = 0, **params: Any
) -> Dataset:
    """Build dataset ``name`` for a model whose input is ``input_shape`` (no batch dim)."""
    cls = get_dataset_class(name)
    valid = accepted_params(cls)
    if valid is not None:
        for key in params:
            if key not in valid:
                raise UnknownNameError(f"{name} dataset parameter", key, valid)
    missing = [p for p in required_params(cls) if p not in params]
    if missing:
        raise TracrError(
            f"Dataset '{name}' needs params.{missing[0]}.",
            hint=f"Required parameters: {', '.join(missing)}.",
        )
    return cls(input_shape=tuple(input_shape), seed=seed, **params)
