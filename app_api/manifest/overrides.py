"""``--set`` overrides in Hydra's grammar.

- ``a.b=v``   change an existing key (a typo is an error, with the closest key);
- ``+a.b=v``  add a key that is not there (missing parent mappings are created);
- ``++a.b=v`` add or change;
- ``~a.b``    remove a key (``~a.b=v`` only if its value is ``v``).

Values are YAML (``yaml.safe_load``): ``3``, ``null``, ``[1, 2]``,
``{codec: lz4}``. List items are addressed by index
(``participant_instances.0.device=lab-1``) or, where the items are named
mappings, by name (``participant_instances.edge-1.device=lab-1``,
``playbook.edge-1.0.params.limit=2``). ``+list.N=v`` with N = length appends.

Each override is parsed once, where it enters (the CLI's ``--set``), into an
:class:`Override` (kind, key, value), as Hydra's ``Override`` objects are;
everything downstream (loading, the run planner) takes the objects.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import yaml

from app_api.manifest.errors import KeyPath, ManifestError, format_path
from app_api.manifest.yamlio import safe_load

GRAMMAR_HINT = (
    "Overrides look like key.path=value (change), +key.path=value (add), ~key.path (remove)."
)


class OverrideKind(Enum):
    """What an override does to its key (Hydra's ``OverrideType``)."""

    CHANGE = "change"  # a.b=v
    ADD = "add"  # +a.b=v
    FORCE_ADD = "force_add"  # ++a.b=v
    REMOVE = "remove"  # ~a.b or ~a.b=v


_PREFIXES = (("++", OverrideKind.FORCE_ADD), ("+", OverrideKind.ADD), ("~", OverrideKind.REMOVE))


@dataclass(frozen=True)
class Override:
    """One ``--set`` override, parsed once (see the module docs for the grammar).

    ``value`` is the YAML value (None for a removal without one); ``text`` is the
    override as written, which is what ``str()`` gives and what run records keep.
    """

    kind: OverrideKind
    key: str
    value: Any = field(default=None, hash=False)
    has_value: bool = False
    text: str = ""

    @classmethod
    def parse(cls, text: str) -> Override:
        """Parse ``a.b=v``, ``+a.b=v``, ``++a.b=v`` or ``~a.b[=v]``; a bad one raises ManifestError."""
        kind, body = OverrideKind.CHANGE, text.strip()
        for prefix, k in _PREFIXES:
            if body.startswith(prefix):
                kind, body = k, body[len(prefix) :]
                break
        key, eq, raw = body.partition("=")
        key = key.strip()
        if not eq and kind is not OverrideKind.REMOVE:
            raise ManifestError(f"override '{text}' has no '=value'.", hint=GRAMMAR_HINT)
        if not key or any(not seg for seg in key.split(".")):
            raise ManifestError(f"override '{text}' has an empty key.", hint=GRAMMAR_HINT)
        value = None
        if eq:
            try:
                value = safe_load(raw) if raw.strip() else None
            except yaml.YAMLError as exc:
                raise ManifestError(
                    f"override '{text}': cannot parse the value as YAML "
                    f"({exc.__class__.__name__}).",
                    hint="Quote strings with special characters: key='a: b'.",
                ) from None
            except (ValueError, TypeError, OverflowError) as exc:
                raise ManifestError(f"override '{text}': the value is not usable ({exc}).",
                                    hint=GRAMMAR_HINT) from None
        return cls(kind=kind, key=key, value=value, has_value=bool(eq), text=text)

    @property
    def segments(self) -> list[str]:
        """The key split at its dots."""
        return self.key.split(".")

    @property
    def value_text(self) -> str:
        """The value as written (``VALUE`` when there is none), for error messages."""
        return self.text.partition("=")[2] if self.has_value else "VALUE"

    def sets(self, key: str) -> bool:
        """True when this override gives ``key`` a value (change or add, not remove)."""
        return self.key == key and self.kind is not OverrideKind.REMOVE

    def __str__(self) -> str:
        return self.text


def parse_overrides(overrides: Iterable[str | Override]) -> tuple[Override, ...]:
    """Overrides as :class:`Override` objects, in order (parsed ones are kept as they are)."""
    return tuple(o if isinstance(o, Override) else Override.parse(o) for o in overrides or ())


def _resolve_index(container: list, seg: str) -> int | None:
    """A list index from a number or from the ``name`` of a mapping item."""
    if seg.lstrip("-").isdigit():
        try:
            i = int(seg)
        except ValueError:  # more digits than int() takes: no list is that long
            return None
        return i + len(container) if i < 0 else i
    for i, item in enumerate(container):
        if isinstance(item, dict) and item.get("name") == seg:
            return i
    return None


def _all_paths(data: Any, prefix: tuple = ()) -> list[str]:
    out = []
    if isinstance(data, dict):
        items: Iterable = data.items()
    elif isinstance(data, list):
        items = enumerate(data)
    else:
        return out
    for k, v in items:
        out.append(format_path(prefix + (k,)))
        out += _all_paths(v, prefix + (k,))
    return out


def _not_found(text: str, key: str, value_text: str, data: dict) -> ManifestError:
    close = difflib.get_close_matches(key, _all_paths(data), n=1, cutoff=0.7)
    msg = f"Could not override '{key}'. To add it use +{key}={value_text}"
    if close:
        msg += f" (did you mean '{close[0]}'?)"
    return ManifestError(msg, hint=f"from override '{text}'. {GRAMMAR_HINT}")


def apply_one(
    data: dict,
    override: Override,
    touched: dict[KeyPath, str] | None = None,
    lines: dict[KeyPath, int] | None = None,
) -> None:
    """Apply one override to ``data`` in place; record the resolved key path in ``touched``.

    ``lines`` (key path -> source line) is kept in step when list items are
    inserted or removed, so later errors still point at the right line.
    """
    op, segs, text = override.kind, override.segments, override.text
    # a copy: one override may be applied to several manifests (a bandwidth sweep's runs)
    value, has_value = copy.deepcopy(override.value), override.has_value
    key, value_text = override.key, override.value_text
    node: Any = data
    path: list = []
    for depth, seg in enumerate(segs):
        last = depth == len(segs) - 1
        if isinstance(node, dict):
            exists = seg in node
            if last:
                return _finish(
                    data,
                    node,
                    seg,
                    exists,
                    op,
                    value,
                    has_value,
                    text,
                    key,
                    value_text,
                    path,
                    (touched, lines),
                )
            if not exists:
                if op in (OverrideKind.ADD, OverrideKind.FORCE_ADD):
                    node[seg] = {}
                else:
                    raise _not_found(text, key, value_text, data)
            path.append(seg)
            node = node[seg]
        elif isinstance(node, list):
            idx = _resolve_index(node, seg)
            if idx is None or idx < 0:
                raise ManifestError(
                    f"Could not override '{key}': '{format_path(tuple(path))}' is a list; "
                    f"'{seg}' is neither an index nor the name of one of its items.",
                    hint=f"from override '{text}'",
                )
            exists = idx < len(node)
            if last:
                return _finish(
                    data,
                    node,
                    idx,
                    exists,
                    op,
                    value,
                    has_value,
                    text,
                    key,
                    value_text,
                    path,
                    (touched, lines),
                )
            if not exists:
                raise ManifestError(
                    f"Could not override '{key}': '{format_path(tuple(path))}' has only {len(node)} items.",
                    hint=f"from override '{text}'",
                )
            path.append(idx)
            node = node[idx]
        else:
            raise ManifestError(
                f"Could not override '{key}': '{format_path(tuple(path))}' is a value "
                f"({node!r}), not a mapping or list.",
                hint=f"from override '{text}'",
            )


def _shift(maps: tuple, list_path: KeyPath, index: int, delta: int) -> None:
    """Renumber key paths under ``list_path`` after an insert (+1) or delete (-1) at ``index``."""
    n = len(list_path)
    for m in maps:
        if m is None:
            continue
        moved = {}
        for p in list(m):
            if len(p) > n and p[:n] == list_path and isinstance(p[n], int) and p[n] >= index:
                value = m.pop(p)
                if delta > 0 or p[n] > index:
                    moved[p[:n] + (p[n] + delta,) + p[n + 1 :]] = value
        m.update(moved)


def _finish(data, node, k, exists, op, value, has_value, text, key, value_text, path, maps) -> None:
    touched = maps[0]
    full = tuple(path) + (k,)
    remove = op is OverrideKind.REMOVE
    if isinstance(node, list) and (remove or not exists):
        _shift(maps, tuple(path), k, -1 if remove else +1)
    if op is OverrideKind.CHANGE:
        if not exists:
            raise _not_found(text, key, value_text, data)
        node[k] = value
    elif op is OverrideKind.ADD:
        if exists:
            raise ManifestError(
                f"Could not add '{key}': it already exists. To change it use {key}={value_text}",
                hint=f"from override '{text}'; ++{key}=... adds or changes.",
            )
        _put(node, k, value, text, key)
    elif op is OverrideKind.FORCE_ADD:
        if exists:
            node[k] = value
        else:
            _put(node, k, value, text, key)
    else:  # remove
        if not exists:
            raise ManifestError(
                f"Could not remove '{key}': it does not exist.", hint=f"from override '{text}'"
            )
        if has_value and node[k] != value:
            raise ManifestError(
                f"Could not remove '{key}': its value is {node[k]!r}, not {value!r}.",
                hint=f"from override '{text}'",
            )
        del node[k]
    if touched is not None and not remove:  # a removed key cannot be the culprit later
        touched[full] = text


def _put(node, k, value, text, key) -> None:
    if isinstance(node, list):
        if k > len(node):
            raise ManifestError(
                f"Could not add '{key}': the list has {len(node)} items; "
                f"use index {len(node)} to append.",
                hint=f"from override '{text}'",
            )
        node.insert(k, value)
    else:
        node[k] = value


def apply_overrides(data: dict, overrides: Iterable[str | Override]) -> dict:
    """Return a copy of ``data`` with ``overrides`` applied in order (see module docs)."""
    out = copy.deepcopy(data)
    for override in parse_overrides(overrides):
        apply_one(out, override)
    return out
