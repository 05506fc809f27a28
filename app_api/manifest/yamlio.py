"""Reading manifest YAML while remembering the line of every key and list item."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from app_api.manifest.errors import KeyPath, ManifestError, format_path


def _walk(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int], file: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = key_node.value
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


def load_yaml_text(text: str, file: str) -> tuple[Any, dict[KeyPath, int]]:
    """Parse ``text``; return the data and ``{key path: 1-based line}``."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        lines: dict[KeyPath, int] = {}
        if node is None:
            return None, lines
        _walk(node, (), lines, file)
        loader = yaml.SafeLoader(text)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise ManifestError(f"invalid YAML: {problem}", file=file, line=line) from None
    except yaml.YAMLError as exc:
        raise ManifestError(f"invalid YAML: {exc}", file=file) from None
    return data, lines


def load_yaml_file(path: Path, label: str | None = None) -> tuple[Any, dict[KeyPath, int]]:
    """Read and parse a manifest file (see :func:`load_yaml_text`); errors name it ``label``."""
    label = label or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError(f"cannot read manifest: {exc.strerror or exc}", file=label) from None
    return load_yaml_text(text, label)
