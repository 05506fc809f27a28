"""The documentation site: its references are generated from the code and kept current,
and the site builds with ``mkdocs build --strict``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from app_api import reference

REPO = Path(__file__).resolve().parents[2]
PAGES = REPO / "docs" / "reference"


@pytest.mark.parametrize("name", sorted(reference.PAGES))
def test_the_committed_reference_is_what_the_code_generates(name):
    # a command, an option or a manifest key added without regenerating fails here
    committed = (PAGES / name).read_text()
    assert committed == reference.PAGES[name](), (
        f"docs/reference/{name} is out of date: run python -m app_api.reference "
        "docs/reference")


def test_every_command_and_every_manifest_key_has_its_entry():
    cli = (PAGES / "cli.md").read_text()
    commands = [path for path, _, _ in reference.commands()]
    assert {"tracr lab up", "tracr lab verify", "tracr experiment run", "tracr device prepare",
            "tracr results show", "tracr bench preempt"} <= set(commands)
    for path in commands:
        assert f"`{path}`" in cli, path
    manifest = (PAGES / "manifest.md").read_text()
    keys = [path for path, _ in reference.keys()]
    assert {"lab.cpu_mode", "network.bandwidth", "participant_instances[].device",
            "playbook.<name>[].task", "run.warmup"} <= set(keys)
    for path in keys:
        assert f"| `{path}` |" in manifest, path


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None
                    or importlib.util.find_spec("material") is None,
                    reason="mkdocs-material is not installed (pip install -e '.[dev]')")
def test_the_site_builds_strict(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                           "-d", str(tmp_path / "site")], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1",
                                                       "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
