"""Every ``tracr`` command line the README, the documentation site and the manifests'
headers show is one the CLI accepts: a researcher copies them as they are (the pareto headers once said
``tracr results pareto NAME last``, which the CLI refused)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from app import build_parser

ROOT = Path(__file__).parents[2]
COMMAND = re.compile(r"\s*(?:\$ )?(?:sudo (?:-E )?)?(tracr .*)")
OPTIONAL = re.compile(r"\s\[--?[^\]]*\]")  # usage notation: [--port 22]


def _commands(text: str, where: str):
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        m = COMMAND.match(line)
        if m:
            yield where, m.group(1)


def documented_commands() -> list[tuple[str, str]]:
    """(where, command line) for each ``tracr`` command shown in the docs."""
    found: list[tuple[str, str]] = []
    for path in sorted((ROOT / "manifests").glob("*.yaml")):
        header = "\n".join(ln[1:] for ln in path.read_text().splitlines() if ln.startswith("#"))
        found += _commands(header, f"manifests/{path.name}")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        where = str(page.relative_to(ROOT))
        for block in re.findall(r"```(?:sh|bash|console)\n(.*?)```", page.read_text(), re.S):
            found += _commands(block, where)
    return found


def test_the_docs_show_commands():
    where = {w for w, _ in documented_commands()}
    assert "README.md" in where and "manifests/paretopipe-mobilenet.yaml" in where
    assert "docs/tutorial.md" in where and "docs/guide/lab.md" in where


@pytest.mark.parametrize("where,command", documented_commands())
def test_a_documented_command_parses(where, command, capsys):
    argv = shlex.split(OPTIONAL.sub("", command), comments=True)[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        assert not exc.code, f"{where}: `{command}` is refused:\n{capsys.readouterr().err}"
