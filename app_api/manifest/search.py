"""Where manifests live: ``./manifests``, tracr's own ``manifests/`` (beside ``app.py``, or
installed with the package), ``$TRACR_CONFIG_DIR/manifests``."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from app_api.manifest.errors import ManifestError
from app_api.manifest.yamlio import load_yaml_file
from experiment_design.errors import UnknownNameError

SUFFIXES = (".yaml", ".yml")


def config_dir() -> Path:
    """``$TRACR_CONFIG_DIR`` or ``~/.config/tracr``."""
    return Path(
        os.environ.get("TRACR_CONFIG_DIR") or Path.home() / ".config" / "tracr"
    ).expanduser()


def repo_manifest_dir() -> Path:
    """The ``manifests/`` folder next to ``app.py``, found without importing it."""
    spec = importlib.util.find_spec("app")
    if spec is not None and spec.origin and spec.origin.endswith("app.py"):
        return Path(spec.origin).resolve().parent / "manifests"
    return Path(__file__).resolve().parents[2] / "manifests"


def installed_manifest_dir() -> Path:
    """Where an installed (not editable) tracr keeps its shipped manifests (a wheel's data
    files: ``<prefix>/share/tracr/manifests``)."""
    return Path(sys.prefix) / "share" / "tracr" / "manifests"


def search_dirs() -> list[Path]:
    """The manifest folders in lookup order (first match wins), without duplicates."""
    dirs, seen = [], set()
    for d in (Path.cwd() / "manifests", repo_manifest_dir(), installed_manifest_dir(),
              config_dir() / "manifests"):
        key = d.resolve() if d.exists() else d.absolute()
        if key not in seen:
            seen.add(key)
            dirs.append(d)
    return dirs


def _looks_like_path(name: str) -> bool:
    return os.sep in name or "/" in name or name.endswith(SUFFIXES)


def _files() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in search_dirs():
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            if p.suffix in SUFFIXES and p.is_file() and p.stem not in found:
                found[p.stem] = p
    return found


def find_manifest(name: str) -> Path:
    """The manifest file for experiment ``name``, or ``name`` itself when it is a file path."""
    if _looks_like_path(name):
        p = Path(name).expanduser()
        if p.is_file():
            return p
        if os.sep in name or "/" in name:
            raise ManifestError(f"Manifest file not found: {p}")
        name = p.stem
    files = _files()
    if name in files:
        return files[name]

    msg = UnknownNameError("experiment", name, files).message
    raise ManifestError(
        msg,
        hint=f"Manifests are looked up in {', '.join(str(d) for d in search_dirs())}. "
        f"Create one with `tracr experiment new {name}`.",
    )


def list_manifests() -> list[tuple[str, Path, str]]:
    """``(name, path, description)`` of every manifest on the search path, sorted by name."""
    out = []
    for name, path in sorted(_files().items()):
        try:
            data, _ = load_yaml_file(path)
            desc = data.get("description", "") if isinstance(data, dict) else ""
            desc = " ".join(str(desc or "").split())
        except ManifestError as exc:
            desc = f"(unreadable: {exc.problem})"
        out.append((name, path, desc))
    return out
