"""`tracr device pair/check/prepare/ls/rm`: the registry of devices experiments run on."""

from __future__ import annotations

import argparse
import os
import sys

from app_api.devices.pairing import PairRequest, pair
from app_api.devices.probe import describe, probe, probe_local
from app_api.devices.registry import DeviceRegistry
from app_api.devices.wheels import DevicePlatform, cache_dir, deps_report, pip_download
from experiment_design.errors import TracrError


def _devices_option(p: argparse.ArgumentParser, top: bool) -> None:
    p.add_argument(
        "--devices", metavar="PATH", default=None if top else argparse.SUPPRESS,
        help="device registry file (default: $TRACR_DEVICES or $TRACR_CONFIG_DIR/devices.yaml)",
    )  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    """Add `tracr device ...` to the CLI."""
    p = sub.add_parser("device", help="pair, check, list and remove devices")
    _devices_option(p, top=True)
    cmds = p.add_subparsers(dest="device_cmd", metavar="CMD")

    pp = cmds.add_parser("pair", help="pair a device over SSH (wizard when flags are missing)")
    _devices_option(pp, top=False)
    pp.add_argument("--name", help="device name used in manifests")
    pp.add_argument("--host", help="host name or address for SSH")
    pp.add_argument("--user", help="SSH user")
    pp.add_argument("--port", type=int, help="SSH port (default 22)")
    pp.add_argument(
        "--key", help="private key path (default ~/.ssh/id_ed25519, else one tracr creates)"
    )
    pp.add_argument("--python", help="python interpreter on the device (default python3)")
    pp.add_argument("--data-host", help="address partners use for the data path (default: --host)")
    pp.add_argument("--description", help="free text")
    pp.add_argument("--tag", action="append", dest="tags", help="a tag (repeatable)")
    pp.add_argument(
        "--yes", action="store_true",
        help="answer yes to creating a key pair (not to trusting a host key)",
    )  # fmt: skip
    pp.add_argument(
        "--password-stdin", action="store_true", help="read the SSH password from stdin"
    )
    pp.add_argument("--rekey", action="store_true", help="accept and record a changed host key")
    pp.add_argument(
        "--accept-new-host-key", action="store_true",
        help="trust a new device's host key without asking (compare the fingerprint shown "
        "with the device's own first); without it tracr asks, or refuses when it cannot ask",
    )  # fmt: skip
    pp.set_defaults(func=cmd_pair)

    cp = cmds.add_parser(
        "check", help="probe devices: reachable, login, python, torch, accelerator"
    )
    _devices_option(cp, top=False)
    cp.add_argument("names", nargs="*", metavar="NAME", help="devices to check (default: all)")
    cp.add_argument("--json", action="store_true", help="print the results as JSON")
    cp.set_defaults(func=cmd_check)

    wp = cmds.add_parser(
        "prepare", help="fill the wheel cache with what devices lack (needs the package index)"
    )
    _devices_option(wp, top=False)
    wp.add_argument("names", nargs="*", metavar="NAME", help="devices to prepare (default: all)")
    wp.set_defaults(func=cmd_prepare)

    lp = cmds.add_parser("ls", help="list devices with their last known status")
    _devices_option(lp, top=False)
    lp.add_argument("--check", action="store_true", help="probe every device first")
    lp.add_argument("--json", action="store_true", help="print as JSON")
    lp.set_defaults(func=cmd_ls)

    rp = cmds.add_parser("rm", help="remove a device from the registry")
    _devices_option(rp, top=False)
    rp.add_argument("name", metavar="NAME")
    rp.set_defaults(func=cmd_rm)

    p.set_defaults(func=lambda args: p.print_help())


def export_devices_path(args: argparse.Namespace) -> None:
    """Honour `--devices PATH`: exported so everything downstream (and subprocesses) sees it."""
    path = getattr(args, "devices", None)
    if path:
        os.environ["TRACR_DEVICES"] = os.path.abspath(os.path.expanduser(path))


def _ask_yes(question: str) -> bool:
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _wizard(args: argparse.Namespace) -> None:
    def ask(label: str, current, default=None):
        if current is not None:
            return current
        shown = f" [{default}]" if default is not None else ""
        value = input(f"{label}{shown}: ").strip()
        return value or default

    args.name = ask("device name", args.name)
    args.host = ask("host", args.host)
    args.user = ask("user", args.user, os.environ.get("USER") or "root")
    args.port = int(ask("port", args.port, 22))
    args.python = ask("python on the device", args.python, "python3")


def cmd_pair(args: argparse.Namespace) -> int:
    export_devices_path(args)

    interactive = sys.stdin.isatty() and not args.password_stdin
    if interactive and (args.name is None or (args.host is None and not args.rekey)):
        _wizard(args)
    if not args.name:
        raise TracrError(
            "--name is required.", hint="tracr device pair --name NAME --host HOST --user USER"
        )
    password = None
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")

    def ask_password(prompt: str) -> str:
        import getpass

        return getpass.getpass(prompt)

    req = PairRequest(
        name=args.name, host=args.host, user=args.user, port=args.port, key=args.key,
        python=args.python, data_host=args.data_host, description=args.description,
        tags=args.tags, yes=args.yes, rekey=args.rekey, password=password,
        accept_new_host_key=args.accept_new_host_key,
        ask=_ask_yes if interactive else None, ask_password=ask_password if interactive else None,
    )  # fmt: skip
    dev = pair(req)
    status = (dev.last_check or {}).get("status", "?")
    print(
        f"paired {dev.name}: {dev.target}:{dev.port}  status: {status}  {describe(dev.last_check)}"
    )
    return 0 if status == "ok" else 1


def _probe_any(dev):
    return probe_local() if dev.builtin else probe(dev)


def cmd_check(args: argparse.Namespace) -> int:
    export_devices_path(args)
    import json

    reg = DeviceRegistry.load()
    names = args.names or reg.names()
    devices = [reg.get(n) for n in names]  # unknown names fail before any probe
    results = {}
    for dev in devices:
        dev.last_check = _kept(dev.last_check, _probe_any(dev))
        results[dev.name] = dev.last_check
        if not dev.builtin:
            reg.add(dev)
    if any(not d.builtin for d in devices):
        reg.save()

    deps = {d.name: deps_report(d.last_check) for d in devices if not d.builtin}
    if args.json:
        print(json.dumps({n: {**r, "deps": deps.get(n)} for n, r in results.items()}, indent=2))
    else:
        _print_table(devices, detail=True)
        for name, rep in deps.items():
            if rep is not None:
                print(_deps_line(name, rep))
    covered = all(not rep or not rep["uncached"] for rep in deps.values())
    return 0 if covered and all(r.get("status") == "ok" for r in results.values()) else 1


def _kept(old: dict | None, fresh: dict) -> dict:
    """``fresh``, with the platform and modules of ``old`` when the device could not be
    asked (offline): what it lacks, as of its last check that reached it."""
    if fresh.get("platform") or not (old or {}).get("platform"):
        return fresh
    return {**fresh, "platform": old["platform"], "modules": old.get("modules")}


def _deps_line(name: str, rep: dict) -> str:
    """What ``name`` lacks of what participants import, and whether the cache covers it."""
    if not rep["lacks"]:
        return f"{name}: has every package participants import"
    line = f"{name}: lacks {', '.join(rep['lacks'])} (python {rep['python']}, {rep['platform']}); "
    if not rep["uncached"]:
        return line + "all in the wheel cache: shipped at deploy"
    return line + (f"not in the wheel cache: {', '.join(rep['uncached'])}; "
                   f"run `tracr device prepare {name}` while online")


def cmd_prepare(args: argparse.Namespace) -> int:
    """Probe each device (or take its last check, if it is offline) and fetch the wheels
    of what it lacks for its platform and python into the cache."""
    export_devices_path(args)

    reg = DeviceRegistry.load()
    devices = [reg.get(n) for n in (args.names or reg.names()) if n != "localhost"]
    for dev in devices:
        dev.last_check = _kept(dev.last_check, _probe_any(dev))
        reg.add(dev)
        rep = deps_report(dev.last_check)
        if rep is None:
            raise TracrError(f"{dev.name}: no platform recorded ({dev.last_check.get('status')}).",
                             hint=f"tracr device check {dev.name} once the device is reachable")
        platform = DevicePlatform.from_facts(dev.last_check["platform"])
        lines = pip_download(platform, rep["lacks"])
        for line in lines:
            print(f"{dev.name}: {line}")
        print(f"{dev.name}: {len(rep['lacks'])} packages it lacks, "
              f"{'all' if rep['lacks'] else 'none'} in {cache_dir(platform)}")
    if devices:
        reg.save()
    return 0


def _rows(devices) -> list[dict]:
    rows = []
    for d in devices:
        chk = d.last_check or {}
        rows.append({
            "name": d.name, "status": chk.get("status", "ok" if d.builtin else "never checked"),
            "address": "local" if d.builtin else f"{d.target}:{d.port}", "data_host": d.address,
            "python": d.python, "detail": describe(chk) if chk else "", "tags": d.tags,
            "description": d.description, "checked_at": chk.get("checked_at"), "last_check": chk or None,
        })  # fmt: skip
    return rows


def _print_table(devices, detail: bool = False) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from app_api.runner.progress import printable  # loads torch: not at tracr --help

    def cell(text) -> str:  # what a device reported is shown, never obeyed (markup, escapes)
        return escape(printable(text))

    colours = {"ok": "green", "never checked": "dim"}
    table = Table(title="tracr devices")
    for col in ("name", "status", "address", "python", "torch / accelerator", "tags", "checked"):
        table.add_column(col)
    for row in _rows(devices):
        colour = colours.get(row["status"], "red")
        table.add_row(
            cell(row["name"]), f"[{colour}]{cell(row['status'])}[/{colour}]", cell(row["address"]),
            cell(row["python"]), cell(row["detail"]), cell(",".join(row["tags"])),
            cell(row["checked_at"] or ""),
        )  # fmt: skip
    Console().print(table)
    if detail:
        for d in devices:
            err = (d.last_check or {}).get("error")
            if err and (d.last_check or {}).get("status") != "ok":
                print(f"\n{d.name}: {d.last_check['status']}\n{printable(err)}", file=sys.stderr)


def cmd_ls(args: argparse.Namespace) -> int:
    export_devices_path(args)
    import json

    reg = DeviceRegistry.load()
    devices = reg.devices()
    if args.check:
        for dev in devices:
            dev.last_check = _probe_any(dev)
            if not dev.builtin:
                reg.add(dev)
        reg.save()
    if args.json:
        print(json.dumps(_rows(devices), indent=2, default=str))
    else:
        _print_table(devices)
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    export_devices_path(args)

    reg = DeviceRegistry.load()
    dev = reg.remove(args.name)
    reg.save()
    print(f"removed {dev.name} ({dev.target}:{dev.port}); its key and known_hosts entry were kept")
    return 0
