"""`tracr lab`: emulated SSH hosts with shaped links on this machine (Linux, root)."""

from __future__ import annotations

import argparse
import json
import sys

from app_api import lab
from app_api.lab import links, verify
from app_api.lab.requirement import LabSpec, stated_lab
from app_api.units import format_rate
from experiment_design.errors import TracrError

_RATE_HELP = (
    "link rate per direction, e.g. 4MB/s, 1.5MB/s, 32Mbit, 100mbps or a plain number of "
    "bytes/s. MB = 10^6 bytes, MiB = 2^20 bytes; 'bit' and 'bps' mean bits per second "
    "(100mbps = 12.5 MB/s, unlike tc where mbps means megabytes)"
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "lab",
        help="emulated devices: network namespaces + sshd + shaped links (Linux, root)",
        description="Emulated devices on this machine: each host is a network namespace with "
        "its own sshd, paired as lab-1..lab-N, joined by a bridge with shaped links.",
    )
    cmds = p.add_subparsers(dest="lab_cmd", metavar="CMD")

    up = cmds.add_parser("up", help="create the lab hosts, pair them, shape and measure the link")
    up.add_argument("--hosts", type=int, default=None, help="number of hosts (default 2)")
    up.add_argument(
        "--manifest",
        metavar="NAME",
        help="bring up the lab this experiment states (its 'lab' section: hosts, CPU shares "
        "and mode; its 'network' section: the first rate and the delay); no other lab flag",
    )
    up.add_argument("--bandwidth", metavar="RATE", help=_RATE_HELP)
    _link_args(up)
    up.add_argument(
        "--cpu-quota",
        nargs="+",
        default=[],
        metavar="HOST=CORES",
        help="CPU quota per host as a fraction of one core, e.g. lab-1=0.25 (1.5 = 1.5 cores)",
    )
    up.add_argument(
        "--cpu-period-ms",
        type=float,
        default=None,
        metavar="MS",
        help="CFS period of the CPU quotas in ms (default 10, longer for a quota under 0.1 "
        "core, whose 1 ms minimum quota needs it: a quota'd host runs evenly slower; a long "
        "period such as 100 runs at full speed, then stalls); with --cpu-mode duty, how often "
        "the pacer checks each host's CPU time (default 1)",
    )
    up.add_argument(
        "--cpu-mode",
        choices=("quota", "duty"),
        default="quota",
        help="how a --cpu-quota slows a host: 'quota' (default) caps its CPU time per CFS "
        "period, so a host that idled runs its next burst at full speed; 'duty' has the "
        "lab's pacer stop it whenever it is ahead of its fraction of CPU time (checked every "
        "1 ms, nothing saved up while idle), so every pass is evenly slower, as on a "
        "slower device",
    )
    up.add_argument(
        "--memory",
        nargs="+",
        default=[],
        metavar="HOST=SIZE",
        help="memory cap per host, e.g. lab-1=600MB (MB = 10^6 bytes, MiB = 2^20; a cgroups "
        "v1 memory limit on the host's sshd and every session: past it the kernel kills "
        "inside that host)",
    )
    up.add_argument(
        "--no-pin",
        action="store_true",
        help="let the hosts share every CPU (default: host i runs on CPU i alone when there "
        "are no more hosts than CPUs, as separate devices would)",
    )
    up.add_argument("--no-verify", action="store_true", help="skip measuring the link")
    up.add_argument("--json", action="store_true", help="print the state as JSON")
    up.set_defaults(func=cmd_up)

    ls = cmds.add_parser("ls", help="show the lab hosts and the link (configured vs measured)")
    ls.add_argument("--json", action="store_true", help="print the state as JSON")
    ls.set_defaults(func=cmd_ls)

    down = cmds.add_parser(
        "down",
        help="remove every host, link, process, cgroup and key of the lab (what it can "
        "prove is the lab's; a tampered state file is refused, exit 1)",
    )
    down.add_argument("--json", action="store_true", help="print what was removed as JSON")
    down.set_defaults(func=cmd_down)

    shape = cmds.add_parser("shape", help="re-shape the running lab and re-measure the link")
    shape.add_argument(
        "--bandwidth", metavar="RATE", help=_RATE_HELP + "; omit to remove the limit"
    )
    _link_args(shape)
    shape.add_argument("--no-verify", action="store_true", help="skip measuring the link")
    shape.add_argument("--json", action="store_true", help="print the link report as JSON")
    shape.set_defaults(func=cmd_shape)

    verify = cmds.add_parser(
        "verify",
        help="measure every link (goodput, round trip, loss) and host CPU share against "
        "what was configured; exit 1 if any misses",
    )
    verify.add_argument("--json", action="store_true", help="print the results as JSON")
    verify.add_argument("--quick", action="store_true",
                        help="fewer and smaller messages (a few seconds per link)")
    verify.set_defaults(func=cmd_verify)

    p.set_defaults(func=lambda args: p.print_help())


def _link_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--delay", metavar="TIME",
                   help="one-way delay on each host's egress (20ms, 0.5ms; a bare number is "
                   "ms): two hosts see a round trip of twice it, the observer once")
    p.add_argument("--jitter", metavar="TIME", help="random delay added to --delay (+-TIME "
                   "uniform, or sigma for normal/pareto); packets are never reordered")
    p.add_argument("--jitter-dist", choices=("uniform", "normal", "pareto"), default="uniform",
                   help="distribution of --jitter (default uniform)")
    p.add_argument("--loss", metavar="PCT", help="random loss on each host's egress (1%% or 0.01)")
    p.add_argument("--loss-model", metavar="ge:p,r[,h,k]",
                   help="bursty Gilbert-Elliott loss instead of --loss: p = P(good->bad), "
                   "r = P(bad->good), h = P(delivered | bad) (default 0), k = P(delivered | "
                   "good) (default 1), e.g. ge:1%%,30%%")
    p.add_argument("--queue", metavar="SIZE", help="drop-tail queue of each egress: packets "
                   "(100, 100p) or bytes (150KB); default 16 MiB, deep enough for TCP")
    p.add_argument("--trace", metavar="FILE|NAME",
                   help="the rate follows a trace: a Mahimahi file (one line per 1500-byte "
                   "opportunity, in ms), a time_s,rate CSV, or a shipped one scaled to "
                   "--bandwidth: steady, step, sawtooth, walk (5x swings)")
    p.add_argument("--link-mode", choices=("auto", "netem", "user"), default="auto",
                   help="auto (default): tbf for a plain rate, netem where the kernel has it, "
                   "else tracr's user-space link emulator; user: always the emulator")
    p.add_argument("--link", nargs="+", default=[], metavar="HOST[:up|down]=K=V,...",
                   help="per-host overrides, e.g. lab-2:down=delay=5ms,loss=2%% "
                   "(keys bandwidth, delay, jitter, loss, loss_model, queue, trace)")


def _link_kwargs(args: argparse.Namespace) -> dict:
    """The link flags beyond --bandwidth and --delay, as lab.up/lab.shape take them."""
    overrides = {}
    for item in args.link:
        where, sep, body = item.partition("=")
        if not sep:
            raise TracrError(f"cannot read --link {item!r}",
                             hint="write HOST[:up|down]=key=value,..., e.g. lab-2:down=delay=5ms")
        values = dict(kv.split("=", 1) for kv in body.split(",") if "=" in kv)
        overrides[where if ":" in where else f"{where}:up"] = values
    return {"jitter": args.jitter, "jitter_dist": args.jitter_dist, "loss": args.loss,
            "loss_model": args.loss_model, "queue": args.queue, "trace": args.trace,
            "link_mode": args.link_mode, "overrides": overrides}


def _say(args: argparse.Namespace):
    if getattr(args, "json", False):
        return lambda msg: None
    return lambda msg: print(f"  {msg}", flush=True)


def cmd_up(args: argparse.Namespace) -> int:
    kwargs = dict(
        hosts=2 if args.hosts is None else args.hosts,
        bandwidth=args.bandwidth,
        delay_ms=args.delay,
        cpu_quota=args.cpu_quota,
        cpu_period_ms=args.cpu_period_ms,
        cpu_mode=args.cpu_mode,
        memory=args.memory,
        pin=not args.no_pin,
    )
    if args.manifest:
        kwargs = _stated_lab(args)
    else:
        kwargs.update(_link_kwargs(args))
    if not args.json:
        print(f"tracr lab up: {kwargs['hosts']} host(s)", flush=True)
    state = lab.up(**kwargs, verify=not args.no_verify, say=_say(args))
    if args.json:
        print(json.dumps(state, indent=2))
    else:
        _print_status(lab.status())
        print(
            "use the hosts as devices lab-1 ... in manifests; 'tracr lab down' removes everything"
        )
    return 0


def _stated_lab(args: argparse.Namespace) -> dict:
    """``lab.up`` keyword arguments for the lab that ``args.manifest`` states."""
    given = [flag for flag, value in (
        ("--hosts", args.hosts), ("--bandwidth", args.bandwidth), ("--delay", args.delay),
        ("--cpu-quota", args.cpu_quota), ("--cpu-period-ms", args.cpu_period_ms),
        ("--memory", args.memory), ("--no-pin", args.no_pin)) if value not in (None, [], False)]
    if args.cpu_mode != "quota":
        given.append("--cpu-mode")
    if given:
        raise TracrError(f"--manifest states the lab; {', '.join(given)} cannot be given with it",
                         hint="drop the flags, or drop --manifest and give the lab by flags")
    name, lab_section, network = stated_lab(args.manifest)
    spec = LabSpec.from_section(lab_section)
    if spec is None:
        raise TracrError(f"{name} states no lab (it has no 'lab' section)",
                         hint="give the lab by flags: tracr lab up --hosts 2 --bandwidth 4MB/s")
    return spec.up_kwargs(network)


def cmd_ls(args: argparse.Namespace) -> int:
    state = lab.status()
    if args.json:
        print(json.dumps(state or {}, indent=2))
    elif state is None:
        print("no tracr lab is up (start one: tracr lab up --hosts 2 --bandwidth 4MB/s)")
    else:
        _print_status(state)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    removed = lab.down(say=_say(args))
    refused = removed.get("refused") or []
    if args.json:
        print(json.dumps(removed, indent=2))
    elif not any(removed.values()):
        print("nothing to remove: no tracr lab is up")
    else:
        print("tracr lab is down")
    for reason in refused:  # a forged or tampered state: said clearly, and exit 1
        print(f"tracr lab down: refused: {reason}", file=sys.stderr)
    return 1 if refused else 0


def cmd_shape(args: argparse.Namespace) -> int:
    report = lab.shape(
        bandwidth=args.bandwidth, delay_ms=args.delay, verify=not args.no_verify, say=_say(args),
        **_link_kwargs(args),
    )
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_status(lab.status())
    return 0


def _print_status(state: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    hosts = Table(title="tracr lab hosts")
    for col in ("name", "netns", "address", "sshd pid", "alive", "cpus", "cpu quota",
                "cpu measured"):
        hosts.add_column(col)
    for h in state["hosts"]:
        quota = h.get("cpu_quota")
        measured = h.get("cpu_measured")
        hosts.add_row(
            h.get("name", "?"),
            h.get("ns", "?"),
            h.get("address", "?"),
            str(h.get("sshd_pid") or "-"),
            "[green]yes[/]" if h.get("alive") else "[red]no[/]",
            ",".join(map(str, h["cpus"])) if h.get("cpus") else "all",
            "-" if quota is None
            else f"{quota:g} core / {h.get('cpu_period_us', 100_000) / 1000:g} ms"
            + (" paced" if h.get("cpu_mode") == "duty" else ""),
            "-" if measured is None else f"{measured:.3f} core"
            + (f", {h['cpu_measured_together']:.3f} all busy"
               if h.get("cpu_measured_together") is not None else ""),
        )
    console.print(hosts)
    pace = state.get("pacer")
    if pace:
        console.print(f"pacer pid {pace.get('pid')}: "
                      + ("[green]running[/]" if pace.get("alive", True) else "[red]not running[/]")
                      + f", {pace.get('period_us', 0) / 1000:g} ms tick")
    shaping = state.get("shaping") or {}
    m = state.get("measured") or {}
    link = Table(title="link (each host's egress)")
    link.add_column("")
    link.add_column("configured")
    link.add_column("measured" + (f" ({m['src']} -> {m['dst']})" if m else ""))
    link.add_row(
        "rate",
        format_rate(shaping.get("bandwidth_Bps")) if shaping.get("bandwidth_Bps") else "unshaped",
        format_rate(m.get("rate_Bps")) + " TCP payload" if m else "-",
    )
    delay = shaping.get("delay_ms")
    link.add_row(
        "rtt",
        f"+{2 * delay:g} ms (2 x {delay:g} ms)" if delay else "-",
        f"{m['rtt_ms']:.3f} ms median (p95 {m['rtt_ms_p95']:.3f})" if m else "-",
    )
    link.add_row("mechanism", str(shaping.get("mechanism") or shaping.get("qdisc") or "none"), "")
    console.print(link)
    _print_links(console, state)
    if not state.get("complete"):
        console.print(
            "[yellow]the lab is incomplete (lab up did not finish); run 'tracr lab down'[/]"
        )


def _print_links(console, state: dict) -> None:
    """Per host and direction: the mechanism, what it does, and whether its emulator runs."""
    from rich.table import Table

    spec = links.spec_from_state(state)
    if not spec:
        return
    emu = state.get("emulator")
    alive = emu.get("alive", True) if emu else None
    table = Table(title="links (up: the host's egress, down: its ingress)")
    for col in ("host", "dir", "mechanism", "configured", "emulator"):
        table.add_column(col)
    for h in state["hosts"]:
        for direction in ("up", "down"):
            cfg = spec.get(h["name"], {}).get(direction)
            if cfg is None:
                continue
            mech = h.get("link_mechanism") if direction == "up" or emu else None
            table.add_row(h["name"], direction, str(mech or "-"), links.describe(cfg),
                          "-" if alive is None else f"pid {emu.get('pid')} "
                          + ("[green]alive[/]" if alive else "[red]DEAD: hosts cut off[/]"))
    console.print(table)
    last = state.get("verify")
    if last:
        console.print(f"last verify {last.get('at')}: " + ("[green]pass[/]" if last.get("ok")
                                                           else "[red]FAIL[/] (tracr lab verify)"))


def cmd_verify(args: argparse.Namespace) -> int:
    result = verify.verify_lab(quick=args.quick, say=_say(args))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        verify.print_table(result)
    return 0 if result["ok"] else 1
