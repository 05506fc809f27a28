"""Reading manifest YAML while remembering the line of every key and list item.

Any file at all may be named as a manifest, so reading is bounded before it is
trusted: at most :data:`MAX_BYTES`, UTF-8 only, nesting at most :data:`MAX_DEPTH`
levels, at most :data:`MAX_ALIASES` aliases, which may neither make the document
bigger than :data:`MAX_NODES` values once expanded (a "billion laughs" file is a
few hundred bytes) nor refer to themselves. Each limit is a :class:`ManifestError` (exit 2) naming the file
and line, never a ``RecursionError`` or ``UnicodeDecodeError``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from app_api.manifest.errors import KeyPath, ManifestError, format_path

#: a manifest is a few KiB; anything past this is not one
MAX_BYTES = 1 << 20
#: nesting levels (a manifest uses about 6)
MAX_DEPTH = 32
#: values in the document with every alias expanded (a manifest has a few hundred)
MAX_NODES = 5_000
#: aliases in one document (a manifest that shares a section uses a handful)
MAX_ALIASES = 100


class _Limit(Exception):
    """A bound of :class:`BoundedLoader` was crossed (message, 0-based line)."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.line = line


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses deep nesting, self-referencing aliases and aliases
    that expand the document past :data:`MAX_NODES` values, while composing (before any
    of it is built)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._open: list[str] = []  # anchors of the collections being composed
        self._size: dict[int, int] = {}  # id(node) -> values under it, aliases expanded

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D102 - PyYAML hook
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise _Limit(f"the alias *{event.anchor} refers to its own anchor (a cycle)",
                             event.start_mark.line)
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _Limit(f"more than {MAX_ALIASES} aliases", event.start_mark.line)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Limit(f"nested more than {MAX_DEPTH} levels deep", event.start_mark.line)
        anchor = getattr(event, "anchor", None)
        opens = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)) and anchor
        if opens:
            self._open.append(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if opens:
                self._open.pop()
        self._count(node, event)
        return node

    def _count(self, node: yaml.Node, event: Any) -> None:
        if id(node) in self._size:
            return
        if isinstance(node, yaml.SequenceNode):
            size = 1 + sum(self._size.get(id(n), 1) for n in node.value)
        elif isinstance(node, yaml.MappingNode):
            size = 1 + sum(self._size.get(id(k), 1) + self._size.get(id(v), 1)
                           for k, v in node.value)
        else:
            size = 1
        if size > MAX_NODES:
            raise _Limit(f"aliases expand the document to more than {MAX_NODES} values "
                         "(a manifest has a few hundred)", event.start_mark.line)
        self._size[id(node)] = size


def _key_text(key_node: yaml.Node, path: KeyPath, file: str) -> str:
    if not isinstance(key_node, yaml.ScalarNode):
        raise ManifestError("keys must be strings, not a list or mapping", file=file,
                            key=format_path(path), line=key_node.start_mark.line + 1)
    return key_node.value


def _walk(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int], file: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = _key_text(key_node, path, file)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ManifestError(
                    f"key '{key}' appears twice (first on line {seen[key]})",
                    file=file,
                    key=format_path(path + (key,)),
                    line=line,
                )
            seen[key] = line
            lines[path + (key,)] = line
            _walk(value_node, path + (key,), lines, file)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            _walk(item, path + (i,), lines, file)


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` with :class:`BoundedLoader`'s limits (for ``--set`` values).

    Raises ``yaml.YAMLError`` for YAML errors and ``ValueError`` for a crossed limit."""
    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    except _Limit as exc:
        raise ValueError(str(exc)) from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
    finally:
        loader.dispose()


def load_yaml_text(text: str, file: str) -> tuple[Any, dict[KeyPath, int]]:
    """Parse ``text``; return the data and ``{key path: 1-based line}``."""
    try:
        node = yaml.compose(text, Loader=BoundedLoader)
        lines: dict[KeyPath, int] = {}
        if node is None:
            return None, lines
        _walk(node, (), lines, file)
        loader = BoundedLoader(text)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except _Limit as exc:
        line = exc.line + 1 if exc.line is not None else None
        raise ManifestError(f"invalid YAML: {exc}", file=file, line=line) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise ManifestError(f"invalid YAML: {problem}", file=file, line=line) from None
    except yaml.YAMLError as exc:
        raise ManifestError(f"invalid YAML: {exc}", file=file) from None
    except RecursionError:  # a bound above should have caught it first
        raise ManifestError("invalid YAML: nested too deeply", file=file) from None
    except (ValueError, TypeError, OverflowError) as exc:  # a constructor on an odd value
        raise ManifestError(f"invalid YAML: {exc}", file=file) from None
    return data, lines


def decode(raw: bytes, label: str) -> str:
    """``raw`` as UTF-8 text (a BOM is dropped); anything else is a located ManifestError."""
    if len(raw) > MAX_BYTES:
        raise ManifestError(
            f"the file is larger than {MAX_BYTES} bytes, too big for a manifest", file=label)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ManifestError(
            f"not a text file: byte 0x{raw[exc.start]:02x} at offset {exc.start} is not UTF-8 "
            "(a manifest is YAML text in UTF-8)", file=label, line=line) from None


def load_yaml_file(path: Path, label: str | None = None) -> tuple[Any, dict[KeyPath, int]]:
    """Read and parse a manifest file (see :func:`load_yaml_text`); errors name it ``label``."""
    label = label or str(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ManifestError(f"cannot read manifest: {exc.strerror or exc}", file=label) from None
    return load_yaml_text(decode(raw, label), label)
