"""Which mechanism shapes the lab's links, and the wiring the user-space emulator needs.

A link spec (:func:`link_spec`) says what each direction of each host's link does:
``up`` is the host's egress, ``down`` its ingress. ``tracr lab up --delay 20ms`` puts 20 ms
on every host's egress, so two hosts see a round trip of 2 x 20 ms; the observer (the
root namespace) is not shaped, so observer <-> host sees 20 ms.

Three mechanisms (:func:`choose_mechanism`, ``--link-mode auto|netem|user``):

- ``tbf`` (kernel token bucket, on the host's egress) for a plain rate. Chosen for
  plain rates in ``auto`` because it is as exact and costs no process: UDP goodput
  within 0.1% of the rate at 16 and 100 Mbit/s, TCP 15.3 Mbit/s of payload at 16 (the
  header overhead: 1448 of 1514 bytes). The emulator measured the same at 16 Mbit/s
  (UDP within 0.2%, TCP 15.3) but took 10-25% of a core there, and 0.7-0.9 of a core
  relaying TCP host to host at 100 Mbit/s (91-93.5 Mbit/s of payload, 2-5% under tbf's
  95.6): every frame crosses it twice, at ~35 us of Python each on this machine.
- ``netem`` (kernel qdisc, on the egress; ingress shaping is refused there) when the
  kernel has it and no trace and no ingress shaping is asked.
- ``user``: the lab's emulator process (:mod:`app_api.lab.emulator`) relays every host's
  frames; everything is supported (traces, ingress, Gilbert-Elliott loss) on any kernel.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from app_api.lab import emulator, network, timeline
from app_api.lab import state as lab_state
from app_api.lab import trace as traces
from app_api.lab.pipe import LinkConfig, parse_fraction, parse_ge, parse_queue
from app_api.lab.system import logged, ok, pid_alive, run, stop_pid
from app_api.units import format_rate, parse_rate
from experiment_design.errors import TracrError

LINK_MODES = ("auto", "netem", "user")
_OFFLOADS = ["tso", "off", "gso", "off", "gro", "off", "tx", "off", "rx", "off"]


def parse_ms(text: str | float | None, what: str) -> float:
    """``20``, ``20ms``, ``0.02s`` -> ms (None/'' -> 0)."""
    if text in (None, ""):
        return 0.0
    s = str(text).strip().lower()
    scale = 1.0
    if s.endswith("ms"):
        s = s[:-2]
    elif s.endswith("us"):
        s, scale = s[:-2], 1e-3
    elif s.endswith("s"):
        s, scale = s[:-1], 1000.0
    try:
        value = float(s) * scale
    except ValueError:
        raise TracrError(f"cannot read the {what} {text!r}", hint="write 20ms, 0.5ms or 20") from None
    if value < 0:
        raise TracrError(f"the {what} cannot be negative ({text!r})")
    return value


def direction_config(bandwidth=None, delay=None, jitter=None, jitter_dist: str = "uniform",
                     loss=None, loss_model: str | None = None, queue=None,
                     trace: str | None = None) -> LinkConfig:
    """One direction's :class:`LinkConfig` from values as a person writes them."""
    rate = parse_rate(bandwidth) if bandwidth not in (None, "") else None
    qb, qp = parse_queue(queue)
    ge = None
    if loss_model not in (None, "", "bernoulli"):
        if not str(loss_model).startswith("ge:"):
            raise TracrError(f"unknown loss model {loss_model!r}",
                             hint="ge:p,r[,h,k] (Gilbert-Elliott), or leave it out for --loss")
        ge = parse_ge(loss_model)
    cfg = LinkConfig(rate_Bps=rate, trace=trace or None, delay_ms=parse_ms(delay, "delay"),
                     jitter_ms=parse_ms(jitter, "jitter"), jitter_dist=jitter_dist,
                     loss=parse_fraction(loss, "loss") if loss not in (None, "") else 0.0,
                     ge=ge, queue_bytes=qb, queue_packets=qp)
    if cfg.trace:
        traces.load(cfg.trace, rate)  # fails now, not in the emulator
        if cfg.trace not in traces.SYNTHETIC:
            cfg.trace = str(Path(cfg.trace).expanduser().resolve())
    return cfg


def link_spec(hosts: list[str], egress: LinkConfig,
              overrides: dict[tuple[str, str], LinkConfig] | None = None) -> dict:
    """``{host: {"up": LinkConfig, "down": LinkConfig}}``: ``egress`` on every host's up,
    nothing on its down, then ``overrides`` by (host, direction)."""
    spec = {h: {"up": LinkConfig(**vars(egress)), "down": LinkConfig()} for h in hosts}
    for (host, direction), cfg in (overrides or {}).items():
        if host not in spec or direction not in ("up", "down"):
            raise TracrError(f"no link {host}:{direction} in this lab",
                             hint=f"hosts are {', '.join(hosts)}; directions up and down")
        spec[host][direction] = cfg
    return spec


def choose_mechanism(spec: dict, mode: str = "auto") -> str | None:
    """``tbf``, ``netem``, ``user`` or None (nothing to shape); see the module's docstring."""
    if mode not in LINK_MODES:
        raise TracrError(f"--link-mode must be one of {', '.join(LINK_MODES)}, not {mode!r}")
    configs = [c for d in spec.values() for c in d.values()]
    if mode == "user":
        return "user"
    if all(c.is_empty() for c in configs):
        return None
    ingress = any(not d["down"].is_empty() for d in spec.values())
    traced = any(c.trace for c in configs)
    if mode == "netem":
        if ingress or traced:
            raise TracrError("--link-mode netem shapes only each host's egress, without traces",
                             hint="use --link-mode user (or auto)")
        if not network.netem_available():
            raise TracrError("--link-mode netem: this kernel has no netem qdisc",
                             hint="use --link-mode user (or auto): tracr's own link emulator")
        return "netem"
    if not ingress and all(c.is_plain() for c in configs):
        return "tbf"
    if not ingress and not traced and network.netem_available():
        return "netem"
    return "user"


def netem_args(c: LinkConfig) -> list[str]:
    """The ``tc qdisc ... netem`` arguments for one egress."""
    args = ["netem"]
    if c.delay_ms or c.jitter_ms:
        args += ["delay", f"{c.delay_ms:g}ms"]
        if c.jitter_ms:
            args += [f"{c.jitter_ms:g}ms", "distribution",
                     {"uniform": "", "normal": "normal", "pareto": "pareto"}[c.jitter_dist]]
            args = [a for a in args if a]
    if c.ge:
        p, r, h, k = c.ge
        args += ["loss", "gemodel", *(f"{100 * x:g}%" for x in (p, r, 1 - h, 1 - k))]
    elif c.loss:
        args += ["loss", "random", f"{100 * c.loss:g}%"]
    if c.rate_Bps:
        args += ["rate", f"{int(round(c.rate_Bps * 8))}bit"]
    limit = c.queue_packets or max(100, int((c.queue_bytes or network.QUEUE_BYTES) / 1514) + 10)
    return [*args, "limit", str(limit)]


def emulator_paths() -> dict:
    d = lab_state.lab_dir()
    return {"config": d / "emulator.json", "timeline": d / "link-timeline.jsonl",
            "log": d / "emulator.log"}


def wire_user(h: dict) -> None:
    """Take host ``h``'s veth off the bridge and put the emulator's pair in its place."""
    x, y = h["veth_emu"], h["veth_bridge"]
    if x not in network.list_links():
        run(["ip", "link", "add", x, "type", "veth", "peer", "name", y])
    for dev in (h["veth_host"], x):
        # the root namespace must not answer ARP or speak IPv6 on the relayed ends
        run(["ip", "link", "set", dev, "arp", "off"])
        _sysctl(f"net/ipv6/conf/{dev}/disable_ipv6", "1")
    for dev in (h["veth_host"], x, y):
        ok(["ethtool", "-K", dev, *_OFFLOADS])
    ok(["ip", "netns", "exec", h["ns"], "ethtool", "-K", h["veth_ns"], *_OFFLOADS])
    run(["ip", "link", "set", x, "up"])
    run(["ip", "link", "set", h["veth_host"], "nomaster"])
    run(["ip", "link", "set", y, "master", network.BRIDGE])
    run(["ip", "link", "set", y, "up"])
    # neighbours learnt before the re-wiring may point past the emulator
    ok(["ip", "netns", "exec", h["ns"], "ip", "neigh", "flush", "all"])


def wire_bridge(h: dict) -> None:
    """Put host ``h``'s veth back on the bridge and remove the emulator's pair."""
    run(["ip", "link", "set", h["veth_host"], "master", network.BRIDGE], check=False)
    run(["ip", "link", "set", h["veth_host"], "arp", "on"], check=False)
    network.delete_link(h["veth_emu"])


def _sysctl(path: str, value: str) -> None:
    with contextlib.suppress(OSError):
        Path("/proc/sys", path).write_text(value)


def emulator_alive(state: dict) -> bool:
    emu = state.get("emulator") or {}
    return emulator.is_ours(emu.get("pid"), lab_state.state_path())


def write_emulator_config(state: dict, spec: dict) -> Path:
    paths = emulator_paths()
    links = [{"host": h["name"], "host_if": h["veth_host"], "bridge_if": h["veth_emu"],
              "up": spec[h["name"]]["up"].to_dict(), "down": spec[h["name"]]["down"].to_dict()}
             for h in state["hosts"]]
    tmp = paths["config"].with_suffix(".tmp")
    tmp.write_text(json.dumps({"links": links}, indent=1))
    os.replace(tmp, paths["config"])
    return paths["config"]


def start_emulator(state: dict, spec: dict, say) -> int:
    """Start (or reconfigure) the emulator for ``spec``; wire every host through it."""
    write_emulator_config(state, spec)
    paths = emulator_paths()
    alive = lab_state.state_path()
    if emulator_alive(state):
        pid = state["emulator"]["pid"]
        os.kill(pid, 1)  # SIGHUP: re-read the config
        return pid
    # the pairs exist before the emulator binds to them
    for h in state["hosts"]:
        if h["veth_emu"] not in network.list_links():
            run(["ip", "link", "add", h["veth_emu"], "type", "veth", "peer", "name",
                 h["veth_bridge"]])
        run(["ip", "link", "set", h["veth_emu"], "up"])
    pid = emulator.start(paths["config"], paths["timeline"], alive, paths["log"])
    state["emulator"] = {"pid": pid, **{k: str(v) for k, v in paths.items()}}
    lab_state.save_state(state)
    deadline = time.monotonic() + 10.0
    ready = f"{emulator.READY} {pid}:"
    while not logged(paths["log"], ready):
        if not pid_alive(pid):
            tail = paths["log"].read_text(errors="replace").strip().splitlines()[-5:]
            raise TracrError("the lab's link emulator exited at start-up: "
                             + " | ".join(tail))
        if time.monotonic() > deadline:
            raise TracrError(f"the lab's link emulator did not start within 10 s; see "
                             f"{paths['log']}")
        time.sleep(0.02)
    for h in state["hosts"]:
        wire_user(h)
    say(f"link emulator pid {pid} relays {len(state['hosts'])} host(s)")
    return pid


def stop_emulator(state: dict) -> list[int]:
    """Stop the lab's emulator(s) and put every host back on the bridge."""
    stopped = [p for p in emulator.find(lab_state.state_path()) if stop_pid(p, timeout=3.0)]
    for h in state.get("hosts") or []:
        if h.get("veth_emu") and h["veth_emu"] in network.list_links():
            wire_bridge(h)
    state.pop("emulator", None)
    return stopped


def apply(state: dict, spec: dict, mode: str, say) -> str | None:
    """Shape the lab's links as ``spec`` says, with ``mode``'s mechanism; returns it."""
    mechanism = choose_mechanism(spec, mode)
    if mechanism != "user" and state.get("emulator"):
        stop_emulator(state)
    for h in state["hosts"]:
        up = spec[h["name"]]["up"]
        if mechanism == "tbf" and up.rate_Bps:
            plan = {"qdisc": "tbf", "args": network.tbf_params(up.rate_Bps)["args"]}
        elif mechanism == "netem" and not up.is_empty():
            plan = {"qdisc": "netem", "args": netem_args(up)}
        else:
            plan = {"qdisc": None, "args": []}
        network.apply_shaping(h, plan)
        h["link_mechanism"] = mechanism if plan["qdisc"] or mechanism == "user" else None
    if mechanism == "user":
        start_emulator(state, spec, say)
    else:  # the emulator writes its own rows; the kernel's mechanisms are recorded here
        timeline.append([{"link": h, "dir": d, "event": "config", "mechanism": mechanism,
                          "rate_Bps": c.rate_Bps, "delay_ms": c.delay_ms,
                          "jitter_ms": c.jitter_ms, "loss": c.mean_loss(), "trace": None,
                          "queue_bytes": c.queue_bytes, "queue_packets": c.queue_packets}
                         for h, dirs in spec.items() for d, c in dirs.items()])
    state["links"] = {"mechanism": mechanism, "mode": mode,
                      "hosts": {h: {d: c.to_dict() for d, c in dirs.items()}
                                for h, dirs in spec.items()}}
    return mechanism


def trace_schedule(c: LinkConfig):
    """The capacity schedule of a direction (:mod:`app_api.lab.trace`), None if unshaped."""
    return traces.schedule(c.rate_Bps, c.trace)


def spec_from_state(state: dict) -> dict:
    """The link spec recorded in ``state`` (``{host: {up, down}}`` of LinkConfig)."""
    hosts = ((state.get("links") or {}).get("hosts")) or {}
    return {h: {d: LinkConfig.from_dict(c) for d, c in dirs.items()} for h, dirs in hosts.items()}


def describe(c: LinkConfig) -> str:
    """One direction in a few words (``16 Mbit/s, 20 ms, loss 1%``), or 'none'."""
    parts = []
    if c.trace:
        parts.append(f"trace {Path(c.trace).name}"
                     + (f" around {format_rate(c.rate_Bps)}" if c.rate_Bps else ""))
    elif c.rate_Bps:
        parts.append(format_rate(c.rate_Bps))
    if c.delay_ms or c.jitter_ms:
        parts.append(f"{c.delay_ms:g} ms" + (f" +-{c.jitter_ms:g} ms {c.jitter_dist}"
                                             if c.jitter_ms else ""))
    if c.ge:
        parts.append("loss ge:" + ",".join(f"{x:g}" for x in c.ge)
                     + f" (mean {100 * c.mean_loss():.3g}%)")
    elif c.loss:
        parts.append(f"loss {100 * c.loss:g}%")
    if c.queue_bytes or c.queue_packets:
        parts.append(f"queue {c.queue_packets} pkts" if c.queue_packets
                     else f"queue {c.queue_bytes} B")
    return ", ".join(parts) or "none"
