"""``tracr experiment ls | show | validate | new | run``.

This module parses arguments and renders results; the work is done in
:mod:`app_api.manifest` (finding, loading, validating, the template) and
:mod:`app_api.runner` (planning and running). ``--set`` is parsed once here into
:class:`~app_api.manifest.Override` objects that everything downstream takes.
This module runs for ``tracr --help``, so the manifest package (PyYAML) and the runner
(torch) are imported inside the handlers, for start-up time.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from app_api.cli.device import export_devices_path
from app_api.cli.results import print_group, print_summary
from app_api.results import find_run
from app_api.terminal import printable
from experiment_design.datasets import get_dataset_class
from experiment_design.params import declared
from experiment_design.partitioners import get_partitioner

OVERRIDE_HELP = "override a manifest key: a.b=v changes, +a.b=v adds, ~a.b removes (repeatable)"


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``tracr experiment ...``."""
    p = sub.add_parser("experiment", help="list, validate and run experiments")
    add_commands(p.add_subparsers(dest="experiment_cmd", metavar="SUBCOMMAND"))
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def add_commands(esub: argparse._SubParsersAction) -> None:
    """Add ``ls``, ``show``, ``validate``, ``new`` and ``run`` to the experiment sub-parsers."""
    p = esub.add_parser("ls", help="list experiments (name, description, path)")
    p.set_defaults(func=cmd_ls)

    p = esub.add_parser("show", help="print the resolved manifest (defaults + overrides) as YAML")
    p.add_argument("name", help="experiment name or path to a manifest file")
    _add_set(p)
    p.set_defaults(func=cmd_show)

    p = esub.add_parser("validate", help="check a manifest without running it (exit 2 if invalid)")
    p.add_argument("name", help="experiment name or path to a manifest file")
    _add_set(p)
    p.set_defaults(func=cmd_validate)

    p = esub.add_parser("new", help="write manifests/NAME.yaml from a commented template")
    p.add_argument("name", help="experiment name (the file name, without .yaml)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.add_argument("--dir", default="manifests", help="folder to write into (default: ./manifests)")
    p.set_defaults(func=cmd_new)

    r = esub.add_parser("run", help="run an experiment (a manifest name or path)")
    r.add_argument("name", metavar="NAME|PATH")
    _add_set(r)
    r.add_argument("--out", default=None, metavar="DIR",
                   help="write the results here (a new or empty directory; a previous run's "
                        "is refused)")
    r.add_argument("--resume", default=None, metavar="RUN",
                   help="continue an incomplete run (its id, directory or 'last'): the split "
                        "points it measured are not measured again; results go to a new "
                        "directory that also holds its rows")
    r.add_argument("--no-progress", action="store_true", help="no progress bar or live logs")
    r.add_argument("--json", action="store_true", help="print summary.json on stdout")
    r.add_argument("--devices", default=None, metavar="PATH",
                   help="device registry to use (default $TRACR_DEVICES or ~/.config/tracr)")
    r.set_defaults(func=cmd_run)


def _add_set(parser: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE`` (repeatable), stored as written in ``args.overrides``."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help=OVERRIDE_HELP,
    )  # fmt: skip


def _load(args: argparse.Namespace):
    """The manifest named on the command line, with its ``--set`` overrides parsed once."""
    from app_api.manifest import load_manifest, parse_overrides

    return load_manifest(args.name, parse_overrides(args.overrides or []))


def _rel(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)


def cmd_ls(args: argparse.Namespace) -> int:
    """Print one line per manifest on the search path."""
    from app_api.manifest import list_manifests, search_dirs

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
    m = _load(args)
    print(f"# {m.name}: {_rel(m.path)}" if m.path else f"# {m.name}")
    for o in m.overrides:
        print(f"# override: {o}")
    sys.stdout.write(m.to_yaml())

    for kind, name, cls in (("partitioner", m.partitioner["name"],
                             get_partitioner(m.partitioner["name"])),
                            ("dataset", m.dataset["name"], get_dataset_class(m.dataset["name"]))):
        params = declared(cls)
        if params:
            print(f"# {kind} {name} declares:")
            for key, p in params.items():
                print(f"#   {key}: {p.describe()}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate; print ``OK: ...`` (errors raise ManifestError, exit code 2)."""
    m = _load(args)
    people = ", ".join(
        f"{i['name']} ({m.role_of(i['name'])} on {i['device']})" for i in m.participant_instances
    )
    print(
        f"OK: {m.name} ({_rel(m.path)}): model {m.model['name']}, {people}; "
        f"partitioner {m.partitioner['name']}, dataset {m.dataset['name']}"
    )
    return 0


def cmd_new(args: argparse.Namespace) -> int:
    """Write a commented manifest that validates as written."""
    from app_api.manifest import write_new_manifest

    path = write_new_manifest(args.name, args.dir, force=args.force)
    print(f"Wrote {_rel(path)}. Check it with: tracr experiment validate {args.name}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Load, validate, plan, run, print the summary; exit 0 ok, 1 run failed, 2 user error.

    With ``network.bandwidth`` set the lab link is reshaped first (lab devices only);
    with ``network.bandwidths`` one run per rate goes into a group directory;
    ``--resume RUN`` continues an incomplete run (see :func:`app_api.runner.plan.plan_resume`).
    """
    import json

    from app_api.runner.execute import execute
    from app_api.runner.plan import SWEEP, plan_runs

    export_devices_path(args)
    progress = not args.no_progress

    def say(msg: str) -> None:
        if progress:
            print(msg, file=sys.stderr, flush=True)

    plan = _resume_plan(args) if args.resume else plan_runs(_load(args))

    from app_api.runner.state import RunInterrupted

    try:
        result = execute(plan, out_dir=args.out, progress=progress, say=say)
    except RunInterrupted as exc:
        # the partial run is kept: say where, and how to go on from it
        print(f"interrupted: the partial run is in {exc.run_dir}", file=sys.stderr)
        print(f"hint: continue it with: tracr experiment run {plan.manifest.name} --resume "
              f"{exc.run_dir}", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(result.summary, indent=2, default=str))
    elif plan.kind == SWEEP:
        print_group(result.summary, result.run_dir)
    else:
        print_summary(result.summary, result.run_dir)

    for err in result.errors:  # a participant's own words, often
        print(f"error: {printable(err)}", file=sys.stderr)
    return result.exit_code


def _resume_plan(args: argparse.Namespace):
    """The plan that continues ``--resume RUN``: the manifest with the overrides that run
    was started with, then the command line's."""
    from app_api.manifest import load_manifest, parse_overrides
    from app_api.runner.plan import plan_resume, recorded_overrides

    source = find_run(args.resume)
    recorded = recorded_overrides(source)
    # the same --set given again is not applied twice (a second +a.b=v would be refused)
    overrides = parse_overrides([*recorded, *(o for o in args.overrides or [] if o not in recorded)])
    return plan_resume(load_manifest(args.name, overrides), source)
