"""`tracr experiment` commands: run (here) plus ls/show/validate/new (app_api.manifest)."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``tracr experiment ...``."""
    p = sub.add_parser("experiment", help="list, validate and run experiments")
    esub = p.add_subparsers(dest="experiment_cmd", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    try:
        from app_api.manifest.commands import register_manifest_commands
    except ImportError:
        register_manifest_commands = None
    if register_manifest_commands is not None:
        register_manifest_commands(esub)
    r = esub.add_parser("run", help="run an experiment (a manifest name or path)")
    r.add_argument("name", metavar="NAME|PATH")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V",
                   help="override a manifest key (a.b=v, +a.b=v adds, ~a.b removes); repeatable")
    r.add_argument("--out", default=None, metavar="DIR", help="write the results here")
    r.add_argument("--no-progress", action="store_true", help="no progress bar or live logs")
    r.add_argument("--json", action="store_true", help="print summary.json on stdout")
    r.add_argument("--devices", default=None, metavar="PATH",
                   help="device registry to use (default $TRACR_DEVICES or ~/.config/tracr)")
    r.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    """Load, validate, run, print the summary; exit 0 ok, 1 run failed, 2 user error.

    With ``network.bandwidth`` set the lab link is reshaped first (lab devices only);
    with ``network.bandwidths`` one run per rate goes into a group directory.
    """
    import json

    from app_api.cli.device import export_devices_path
    from app_api.manifest import load_manifest
    from app_api.runner import run_experiment
    from app_api.runner.network import requested_bandwidths

    export_devices_path(args)
    manifest = load_manifest(args.name, list(args.overrides))
    progress = not args.no_progress
    bandwidths = requested_bandwidths(manifest)

    def say(msg: str) -> None:
        if progress:
            print(msg, file=sys.stderr, flush=True)

    if bandwidths is None:
        result = run_experiment(manifest, out_dir=args.out, progress=progress)
    elif len(bandwidths) == 1:
        from app_api.runner.network import run_shaped

        result = run_shaped(manifest, bandwidths[0], out_dir=args.out, progress=progress, say=say)
    else:
        from app_api.runner.bandwidths import run_bandwidths

        result = run_bandwidths(manifest, bandwidths, out_dir=args.out, progress=progress,
                                say=say)
    if args.json:
        print(json.dumps(result.summary, indent=2, default=str))
    elif bandwidths is not None and len(bandwidths) > 1:
        from app_api.cli.results import print_group

        print_group(result.summary, result.run_dir)
    else:
        from app_api.cli.results import print_summary

        print_summary(result.summary, result.run_dir)
    for err in result.errors:
        print(f"error: {err}", file=sys.stderr)
    return result.exit_code
