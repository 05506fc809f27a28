"""Import boundaries: device-side code stays torch-only; `tracr --help` stays instant."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("app_api", "rich", "matplotlib", "plumbum")
DEVICE_SIDE = ("experiment_design", "MyDatasets")


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and getattr(
            node.func, "attr", getattr(node.func, "id", "")
        ) in (
            "import_module",
            "__import__",
        ):
            if (
                node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found.append((node.lineno, node.args[0].value))
    return found


def _device_side_files() -> list[Path]:
    files = []
    for top in DEVICE_SIDE:
        files += sorted((REPO / top).rglob("*.py"))
    return files


def test_there_is_device_side_code_to_check():
    assert any(p.parts[-2:] == ("split", "__init__.py") for p in _device_side_files())


@pytest.mark.parametrize("path", _device_side_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_device_side_code_imports_no_observer_packages(path):
    bad = [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for line, name in _imports(path)
        if name.split(".")[0] in FORBIDDEN
    ]
    assert not bad, "\n".join(bad)


PROBE = """
import sys, io, contextlib
sys.argv = ["tracr", "--help"]
import app
buf = io.StringIO()
try:
    with contextlib.redirect_stdout(buf):
        app.main(["--help"])
except SystemExit:
    pass
assert "tracr" in buf.getvalue()
heavy = sorted(m for m in ("torch", "torchvision", "rich", "matplotlib", "ultralytics") if m in sys.modules)
print(",".join(heavy))
"""


def test_tracr_help_imports_no_torch():
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    heavy = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert "torch" not in heavy.split(","), f"`tracr --help` imported: {heavy}"
