"""`tracr experiment ls | show | validate | new` through the real `tracr` entry point."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import app
from app_api.cli.experiment import add_commands
from app_api.manifest import load_manifest


def tracr(*argv: str) -> int:
    return app.main(list(argv))


def test_commands_register_on_a_parser():
    p = argparse.ArgumentParser()
    add_commands(p.add_subparsers())
    args = p.parse_args(["validate", "x", "--set", "a=1", "--set", "~b"])
    assert args.overrides == ["a=1", "~b"]


def test_ls(capsys):
    assert tracr("experiment", "ls") == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("alexnet-sweep "))
    assert "Neurosurgeon" in line and "alexnet-sweep.yaml" in line


def test_show_prints_resolved_yaml_with_overrides(capsys):
    assert tracr("experiment", "show", "alexnet-sweep", "--set", "run.warmup=7") == 0
    out = capsys.readouterr().out
    assert "# override: run.warmup=7" in out
    data = yaml.safe_load(out)
    assert data["run"]["warmup"] == 7
    assert data["network"]["delay_ms"] is None  # defaults are filled in


def test_validate_ok_and_error_exit_code(capsys, tmp_path):
    assert tracr("experiment", "validate", "resnet18-sweep") == 0
    assert capsys.readouterr().out.startswith("OK: resnet18-sweep")
    assert tracr("experiment", "validate", "resnet18-sweep", "--set", "run.warmpu=1") == 2
    err = capsys.readouterr().err
    assert "Could not override 'run.warmpu'. To add it use +run.warmpu=1" in err
    assert "Traceback" not in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: alexnet\nparticipant_typos: {}\n")
    assert tracr("experiment", "validate", str(bad)) == 2
    assert "bad.yaml:2: participant_typos: unknown key" in capsys.readouterr().err


def test_new_writes_a_valid_commented_manifest(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert tracr("experiment", "new", "my-exp") == 0
    path = tmp_path / "manifests" / "my-exp.yaml"
    assert path.is_file() and "tracr experiment run my-exp" in path.read_text()
    assert load_manifest("my-exp").path.resolve() == path
    assert tracr("experiment", "new", "my-exp") == 2
    assert "already exists" in capsys.readouterr().err
    path.write_text("junk")
    assert tracr("experiment", "new", "my-exp", "--force") == 0
    assert load_manifest("my-exp").name == "my-exp"
    assert tracr("experiment", "new", "bad name") == 2


@pytest.mark.parametrize("name", ["alexnet-sweep", "resnet18-sweep"])
def test_show_output_loads_back(name, tmp_path, capsys):
    assert tracr("experiment", "show", name) == 0
    p = tmp_path / "copy.yaml"
    p.write_text(capsys.readouterr().out)
    assert load_manifest(str(p)).raw == load_manifest(name).raw


VALIDATE_PROBE = """
import sys
import app
code = app.main(["experiment", "validate", sys.argv[1]])
print(",".join(m for m in ("torch", "torchvision") if m in sys.modules))
sys.exit(code)
"""
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["alexnet-sweep", "resnet18-sweep"])
def test_validate_loads_no_torch(name):
    proc = subprocess.run([sys.executable, "-c", VALIDATE_PROBE, name], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"OK: {name}")
    heavy = proc.stdout.strip().splitlines()[-1]
    assert "torch" not in heavy.split(","), f"`tracr experiment validate` imported: {heavy}"
