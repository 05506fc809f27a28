"""Declared parameters of partitioners and datasets: name, type, range, default.

A class lists what it takes in ``PARAMS`` (a dict of :class:`Param`); the observer checks
a manifest's ``partitioner.params`` / ``dataset.params`` against it before any device is
touched (``tracr experiment validate``), with the manifest's file:line, so a bad value is
refused there rather than by the constructor on a device after deploy::

    class Walk(Partitioner):
        PARAMS = {"repeats": Param("int", default=1, min=1, doc="inferences per split")}

A parameter a class does not declare is passed on unchecked (its constructor still
checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

_WORDS = {"int": "an integer", "number": "a number", "str": "a string", "bool": "true or false",
          "list": "a list", "map": "a mapping", "any": "any value"}


@dataclass(frozen=True)
class Param:
    """One declared parameter: its kind (int, number, str, bool, list, map, any), default,
    range (``min``/``max``, inclusive), ``choices``, whether null is allowed, and a doc."""

    kind: str
    default: Any = None
    min: float | None = None
    max: float | None = None
    choices: tuple | None = None
    nullable: bool = False
    doc: str = ""

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` for this parameter, or None."""
        if value is None:
            return None if self.nullable else f"must be {_WORDS[self.kind]}, not null"
        if not _kind_ok(self.kind, value):
            return f"must be {_WORDS[self.kind]}{' or null' if self.nullable else ''}, not " \
                   f"{value!r}"
        if self.choices is not None and value not in self.choices:
            return (f"'{value}' is not allowed. The valid options are "
                    f"[{', '.join(map(str, self.choices))}].")
        if self.min is not None and value < self.min:
            return f"must be >= {self.min:g}, got {value}"
        if self.max is not None and value > self.max:
            return f"must be <= {self.max:g}, got {value}"
        return None

    def describe(self) -> str:
        """One line: kind, default, range, doc (``tracr experiment show``, the reference)."""
        parts = [self.kind + (" or null" if self.nullable else ""), f"default {self.default!r}"]
        if self.choices:
            parts.append("one of " + ", ".join(map(str, self.choices)))
        if self.min is not None:
            parts.append(f">= {self.min:g}")
        if self.max is not None:
            parts.append(f"<= {self.max:g}")
        return "; ".join(parts) + (f": {self.doc}" if self.doc else "")


def _kind_ok(kind: str, v: Any) -> bool:
    if kind == "any":
        return True
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "number":
        return (isinstance(v, (int, float)) and not isinstance(v, bool)
                and math.isfinite(float(v)))
    if kind == "str":
        return isinstance(v, str)
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "list":
        return isinstance(v, list)
    if kind == "map":
        return isinstance(v, dict)
    raise ValueError(f"unknown parameter kind {kind!r}")


def declared(cls: type) -> dict[str, Param]:
    """The parameters ``cls`` declares (its ``PARAMS``, inherited unless it sets its own: a
    subclass that adds some writes ``PARAMS = {**Base.PARAMS, ...}``)."""
    return dict(getattr(cls, "PARAMS", None) or {})


def problems(cls: type, given: dict) -> list[tuple[str, str]]:
    """``(name, problem)`` for each of ``given`` that its declaration refuses."""
    decl = declared(cls)
    out = []
    for name, value in (given or {}).items():
        param = decl.get(name)
        if param is not None and (problem := param.problem(value)):
            out.append((name, problem))
    return out
