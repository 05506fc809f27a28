"""``tracr experiment ls | show | validate | new``.

``app_api/cli/experiment.py`` calls :func:`register_manifest_commands` with its
sub-parsers. Only the standard library is imported at module level (this runs
for ``tracr --help``); manifests are loaded inside the handlers.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
OVERRIDE_HELP = "override a manifest key: a.b=v changes, +a.b=v adds, ~a.b removes (repeatable)"


def add_override_arguments(parser: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE`` (repeatable), stored in ``args.overrides``."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help=OVERRIDE_HELP,
    )  # fmt: skip


def overrides_from_args(args: argparse.Namespace) -> list[str]:
    """The overrides given on the command line, in order."""
    return list(getattr(args, "overrides", None) or [])


def register_manifest_commands(experiment_subparsers: argparse._SubParsersAction) -> None:
    """Add ``ls``, ``show``, ``validate`` and ``new`` under ``tracr experiment``."""
    sub = experiment_subparsers
    p = sub.add_parser("ls", help="list experiments (name, description, path)")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("show", help="print the resolved manifest (defaults + overrides) as YAML")
    p.add_argument("name", help="experiment name or path to a manifest file")
    add_override_arguments(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("validate", help="check a manifest without running it (exit 2 if invalid)")
    p.add_argument("name", help="experiment name or path to a manifest file")
    add_override_arguments(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("new", help="write manifests/NAME.yaml from a commented template")
    p.add_argument("name", help="experiment name (the file name, without .yaml)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.add_argument("--dir", default="manifests", help="folder to write into (default: ./manifests)")
    p.set_defaults(func=cmd_new)


def _rel(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)


def cmd_ls(args: argparse.Namespace) -> int:
    """Print one line per manifest on the search path."""
    from app_api.manifest.search import list_manifests, search_dirs

    rows = list_manifests()
    if not rows:
        dirs = ", ".join(str(d) for d in search_dirs())
        print(f"No manifests found (looked in {dirs}). Create one: tracr experiment new NAME")
        return 0
    width = max(len("NAME"), *(len(n) for n, _, _ in rows))
    print(f"{'NAME':<{width}}  DESCRIPTION  (PATH)")
    for name, path, desc in rows:
        print(f"{name:<{width}}  {desc or '-'}  ({_rel(path)})")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """Print the resolved manifest."""
    from app_api.manifest.manifest import load_manifest

    overrides = overrides_from_args(args)
    m = load_manifest(args.name, overrides)
    print(f"# {m.name}: {_rel(m.path)}" if m.path else f"# {m.name}")
    for o in overrides:
        print(f"# override: {o}")
    sys.stdout.write(m.to_yaml())
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate; print ``OK: ...`` (errors raise ManifestError, exit code 2)."""
    from app_api.manifest import names
    from app_api.manifest.manifest import load_manifest

    m = load_manifest(args.name, overrides_from_args(args))
    people = ", ".join(
        f"{i['name']} ({m.role_of(i['name'])} on {i['device']})" for i in m.participant_instances
    )
    model = m.model
    print(
        f"OK: {m.name} ({_rel(m.path)}): model {model['name']}, {people}; "
        f"partitioner {m.partitioner['name']}, dataset {m.dataset['name']}"
    )
    checks = {
        "roles": names.roles,
        "tasks": names.tasks,
        "partitioners": names.partitioners,
        "models": names.models,
        "datasets": names.datasets,
        "devices": names.devices,
    }
    skipped = [what for what, fn in checks.items() if fn() is None]
    if skipped:
        print(f"note: not checked (registry not installed): {', '.join(skipped)}")
    return 0


def cmd_new(args: argparse.Namespace) -> int:
    """Write a commented manifest that validates as written."""
    from app_api.manifest.errors import ManifestError
    from app_api.manifest.template import new_manifest_text

    if not _NAME.match(args.name) or args.name.endswith((".yaml", ".yml")):
        raise ManifestError(
            f"'{args.name}' is not a valid experiment name",
            hint="Use letters, digits, '-', '_' and '.', without the .yaml suffix.",
        )
    folder = Path(args.dir)
    path = folder / f"{args.name}.yaml"
    if path.exists() and not args.force:
        raise ManifestError(f"{_rel(path)} already exists", hint="Pass --force to overwrite it.")
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(new_manifest_text(args.name), encoding="utf-8")
    print(f"Wrote {_rel(path)}. Check it with: tracr experiment validate {args.name}")
    return 0
