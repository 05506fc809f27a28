"""``Registry``: the one mechanism behind every extension point.

Roles, tasks, partitioners, models and datasets are each a :class:`Registry`
instance; their modules expose thin aliases (``register_task``,
``create_partitioner``, ``list_models``, ...) of its methods.
"""

from __future__ import annotations

import fnmatch
import importlib
import logging
import os
import pkgutil
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from experiment_design.errors import TracrError, UnknownNameError

log = logging.getLogger(__name__)

T = TypeVar("T")


class Registry(Generic[T]):
    """Names -> classes (or factories) of one kind, filled by a decorator.

    ``kind`` is the word used in messages ("task", "dataset"). ``packages``
    are the dotted names of the packages whose modules register entries.

    The rules, the same for every kind:

    - **Naming.** ``@reg.register("name")`` registers under "name"; with no
      name, the class's own ``name_attr`` value (set in its body, not
      inherited), else its ``__name__`` (lowercased for a class). The chosen
      name is written back to ``name_attr`` so an instance knows its name.
    - **Base.** When ``base`` is given, only its subclasses are accepted
      (``TypeError`` otherwise: a programming error, not a user's).
    - **Duplicates.** A name taken by a *different* class or function is a
      :class:`TracrError` naming both. The same qualified name registering
      again (its module re-imported) replaces the old entry.
    - **Discovery.** Every lookup (``get``, ``names``, ``create``,
      ``in``) first imports each module of ``packages`` that is not imported
      yet (module or subpackage, names not starting with ``_``). A package's
      ``__path__`` is read at lookup time, so a file dropped into the package
      (or a folder added to its path) is found by name, with no other wiring;
      the cost after the first call is a directory listing.
    - **Broken modules.** A module that fails to import is never silently
      skipped: the other modules are still imported (so one typo does not
      hide every other entry), then a :class:`TracrError` names the module,
      its error and its file. The next lookup tries it again.
    - **Unknown names.** :class:`UnknownNameError`: the valid names and the
      closest match.
    - **Plugins.** Modules named in ``$TRACR_PLUGINS`` (comma-separated dotted names,
      from a user's own package: its ``tracr.plugins`` entry points or a manifest's
      ``plugins``) are imported on every lookup too, before the packages, so what they
      register is found like a built-in. The observer sets it and hands it to every
      participant, and ships the plugins' packages with the bundle.

    Example::

        TASKS: Registry[type[Task]] = Registry("task", ["experiment_design.tasks"], base=Task)
        register_task = TASKS.register

        @register_task("wait")
        class Wait(Task): ...

        TASKS.create("wait", timeout_s=3)
    """

    def __init__(
        self,
        kind: str,
        packages: Sequence[str] = (),
        *,
        base: type | None = None,
        name_attr: str | None = "name",
        hint: str | None = None,
    ) -> None:
        self.kind = kind
        self.packages = tuple(packages)
        self.base = base
        self.name_attr = name_attr
        self.hint = hint
        self._entries: dict[str, T] = {}

    # ---- filling ------------------------------------------------------------
    def register(self, name: str | None = None) -> Callable[[T], T]:
        """Decorator: register the class or factory under ``name`` (see the naming rule)."""

        def deco(obj: T) -> T:
            self.add(self._default_name(obj) if name is None else name, obj)
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        """Register ``obj`` under ``name`` (the duplicate and base rules apply)."""
        if self.base is not None and not (isinstance(obj, type) and issubclass(obj, self.base)):
            raise TypeError(
                f"a {self.kind} must be a {self.base.__name__} subclass; got {obj!r} for {name!r}"
            )
        old = self._entries.get(name)
        if old is not None and _qualname(old) != _qualname(obj):
            raise TracrError(
                f"{self.kind.capitalize()} name '{name}' is registered twice: by "
                f"{old.__module__}.{_qualname(old)} and {obj.__module__}.{_qualname(obj)}.",
                hint="Rename one of them.",
            )
        if self.name_attr is not None and isinstance(obj, type):
            setattr(obj, self.name_attr, name)
        self._entries[name] = obj

    def remove(self, name: str) -> None:
        """Forget ``name`` (for tests and interactive sessions); unknown names are ignored."""
        self._entries.pop(name, None)

    def _default_name(self, obj: Any) -> str:
        if self.name_attr is not None and isinstance(obj, type):
            own = obj.__dict__.get(self.name_attr)
            if isinstance(own, str) and own:
                return own
            return obj.__name__.lower()
        return obj.__name__

    # ---- looking up ---------------------------------------------------------
    def get(self, name: str) -> T:
        """The entry registered as ``name``; an unknown name lists the valid ones."""
        self.discover()
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self._entries, hint=self.hint) from None

    def names(self, pattern: str | None = None) -> list[str]:
        """Registered names, sorted, optionally filtered by an fnmatch ``pattern``."""
        self.discover()
        names = sorted(self._entries)
        if pattern:
            names = [n for n in names if fnmatch.fnmatch(n, pattern)]
        return names

    def create(self, name: str, **params: Any) -> Any:
        """Instantiate (or call) the entry ``name`` with ``params``.

        A ``TypeError`` from the call (a missing or unexpected parameter) becomes a
        :class:`TracrError` naming the entry.
        """
        factory: Any = self.get(name)
        try:
            return factory(**params)
        except TypeError as exc:
            raise TracrError(f"Bad parameters for {self.kind} '{name}': {exc}") from exc

    def has(self, name: str) -> bool:
        """True if ``name`` is registered now (no discovery: safe while modules import)."""
        return name in self._entries

    def __contains__(self, name: object) -> bool:
        self.discover()
        return name in self._entries

    def __repr__(self) -> str:
        return f"<Registry {self.kind!r} {sorted(self._entries)}>"

    # ---- discovery ----------------------------------------------------------
    def discover(self) -> list[str]:
        """Import every not-yet-imported module of ``packages``; return those imported now.

        Raises :class:`TracrError` after the scan if any module failed to import.
        """
        imported: list[str] = []
        failures: list[tuple[str, BaseException, str]] = []
        for module in plugin_modules():
            if module in sys.modules:
                continue
            try:
                importlib.import_module(module)
                imported.append(module)
            except Exception as exc:  # named below, like a broken module of ours
                failures.append((module, exc, f"the plugin {module} ($TRACR_PLUGINS)"))
        for package in self.packages:
            try:
                pkg = sys.modules.get(package) or importlib.import_module(package)
            except Exception as exc:
                failures.append((package, exc, package.replace(".", "/")))
                continue
            ok, bad = import_modules(package, list(getattr(pkg, "__path__", [])))
            imported += ok
            failures += bad
        if failures:
            name, exc, where = failures[0]
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise TracrError(
                f"Could not import {self.kind} module {name}: {exc}{more}",
                hint=f"Fix or remove {where}.",
            ) from exc
        return imported


#: the environment variable naming plugin modules (see :class:`Registry`)
PLUGINS_ENV = "TRACR_PLUGINS"


def plugin_modules() -> list[str]:
    """The plugin modules named in ``$TRACR_PLUGINS``, in order, without duplicates."""
    raw = os.environ.get(PLUGINS_ENV, "")
    return list(dict.fromkeys(m.strip() for m in raw.split(",") if m.strip()))


def import_modules(
    package: str, path: Iterable[str]
) -> tuple[list[str], list[tuple[str, BaseException, str]]]:
    """Import the not-yet-imported modules found on ``path`` as ``package.<name>``.

    Returns the names imported now and the failures as (module, error, file).
    Modules whose names start with ``_`` are skipped. Errors are collected, not
    raised, so one broken module does not keep the others out.
    """
    imported: list[str] = []
    failures: list[tuple[str, BaseException, str]] = []
    for info in sorted(pkgutil.iter_modules(list(path)), key=lambda m: m.name):
        full = f"{package}.{info.name}"
        if info.name.startswith("_") or full in sys.modules:
            continue
        try:
            importlib.import_module(full)
        except Exception as exc:  # reported to the caller with the file to fix
            where = Path(getattr(info.module_finder, "path", "")) / info.name
            failures.append((full, exc, str(where) if info.ispkg else f"{where}.py"))
            log.warning("could not import %s: %s", full, exc)
            continue
        imported.append(full)
    return imported, failures


def _qualname(obj: Any) -> str:
    return getattr(obj, "__qualname__", repr(obj))
