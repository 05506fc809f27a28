"""Bringing the emulated lab up, re-shaping it, and taking it down again.

Every resource is recorded in the state file right after it is created, so ``down``
undoes exactly what ``up`` did, even when ``up`` stopped half way. ``down`` also looks
for leftovers by our unique names (``tracr-lab-<n>`` namespaces, ``trlab-*`` links and
cgroups), because the lab is one per machine and a lost state file must not strand it.

``down`` runs as root, so it acts only on what it can prove is the lab's: a state whose
names or paths differ from what ``up`` generates is refused (and reported), processes
are stopped only inside our namespaces or when /proc shows our sshd with our config, and
in the user's directory only the files tracr writes there are removed, by name.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import time
from pathlib import Path

from app_api import fsutil
from app_api.devices.registry import known_hosts_path
from app_api.lab import cgroup, links, network, pacer, sshd
from app_api.lab import state as lab_state
from app_api.lab.lock import WAIT_S, link_lock
from app_api.lab.probe import measure_link
from app_api.lab.registry_link import register_hosts, unregister_hosts
from app_api.lab.state import host_entry, load_state, new_state, remove_state, save_state
from app_api.lab.system import logged, pid_alive, require_root, stop_pid
from app_api.units import format_rate
from experiment_design.errors import TracrError

log = logging.getLogger(__name__)


def parse_quotas(
    items: list[str] | dict | None, hosts: int, period: int | None = None
) -> dict[str, float]:
    """``["lab-1=0.25", "lab-2=1.5"]`` (or a dict) -> ``{"lab-1": 0.25, ...}``, checked.

    Each quota is checked against ``period`` (us; None: the default, which is lengthened
    per host where a fraction needs it).
    """
    if not items:
        return {}
    pairs = items.items() if isinstance(items, dict) else (_split_quota(i) for i in items)
    valid = [f"lab-{i}" for i in range(1, hosts + 1)]
    out: dict[str, float] = {}
    for name, value in pairs:
        if name not in valid:
            from experiment_design.errors import UnknownNameError

            raise UnknownNameError("lab host", name, valid, hint="quotas look like lab-1=0.25")
        try:
            fraction = float(value)
        except (TypeError, ValueError):
            raise TracrError(
                f"CPU quota for {name} must be a number of cores, not {value!r}"
            ) from None
        cgroup.quota_us(fraction, cgroup.host_period_us(fraction, period))  # range check
        out[name] = fraction
    return out


def _split_quota(item: str) -> tuple[str, str]:
    if "=" not in item:
        raise TracrError(
            f"cannot read the CPU quota '{item}'",
            hint="write it as lab-1=0.25 (a fraction of one core)",
        )
    name, value = item.split("=", 1)
    return name.strip(), value.strip()


def up(
    hosts: int = 2,
    bandwidth: str | float | None = None,
    delay_ms: float | None = None,
    cpu_quota: list[str] | dict | None = None,
    cpu_period_ms: float | None = None,
    *,
    cpu_mode: str = "quota",
    pin: bool = True,
    verify: bool = True,
    say=lambda msg: None,
    **link_args,
) -> dict:
    """Create ``hosts`` emulated hosts (namespaces + sshd), pair them, shape and verify the link.

    With ``pin`` (default) and no more hosts than CPUs, host i runs on CPU i only, as
    separate devices would: unpinned, an edge and a cloud migrate across the same cores
    and evict each other's caches, and a quota'd edge's prefix cost up to 1.4x the CPU
    time it cost pinned.

    ``cpu_mode``: ``quota`` (a CFS quota per host: a host that idled runs its next burst at
    full speed) or ``duty`` (the lab's pacer holds each quota'd host to its fraction of CPU
    time, checked every ``cpu_period_ms`` (1 ms by default) with no saving up, so it is
    evenly slow; see ``app_api.lab.pacer``).

    ``link_args`` shape the links beyond rate and delay (:func:`link_request`: ``jitter``,
    ``jitter_dist``, ``loss``, ``loss_model``, ``queue``, ``trace``, ``link_mode``,
    ``overrides``); the mechanism (tbf, netem or the user-space emulator) is chosen by
    :func:`app_api.lab.links.choose_mechanism`.

    Returns the state dict (also written to ``$TRACR_CONFIG_DIR/lab/state.json``). On any
    failure everything created so far is removed again before the error propagates.
    """
    require_root()
    if not 1 <= int(hosts) <= network.MAX_HOSTS:
        raise TracrError(f"--hosts must be between 1 and {network.MAX_HOSTS}, not {hosts}")
    if cpu_mode not in CPU_MODES:
        raise TracrError(f"--cpu-mode must be one of {', '.join(CPU_MODES)}, not {cpu_mode!r}")
    duty = None
    if cpu_mode == "duty":
        # the pacer's tick; the cgroups then only cap a host at one core (or its quota)
        duty = pacer_period_us(cpu_period_ms)
        cpu_period_ms = None
    # the CFS period asked for (range-checked; None: each host's default)
    period = None if cpu_period_ms is None else cgroup.period_us(cpu_period_ms)
    quotas = parse_quotas(cpu_quota, int(hosts), period)
    if duty and not quotas:
        raise TracrError("--cpu-mode duty paces the hosts given a --cpu-quota; none was given")
    if quotas:
        cgroup.cgroup_path(
            "tracr-lab-probe"
        )  # fails early with a hint when there is no cpu controller
    sshd.sshd_binary()
    request = link_request(bandwidth, delay_ms, **link_args)
    spec, mode = _link_spec(request, [f"lab-{i}" for i in range(1, int(hosts) + 1)])
    links.choose_mechanism(spec, mode)  # fails early (e.g. netem asked on a kernel without)
    _refuse_if_up()

    state = new_state()
    state.update(
        bridge=network.BRIDGE,
        bridge_address=network.BRIDGE_ADDRESS,
        subnet=f"{network.SUBNET_PREFIX}.0/24",
        python=sys.executable,
        known_hosts=str(known_hosts_path()),
    )
    save_state(state)
    try:
        _build(state, int(hosts), quotas, say, period, pin, duty)
        _apply(state, request, verify, say)
        state["complete"] = True
        save_state(state)
    except BaseException:
        say("lab up failed; removing what was created")
        try:
            down()
        except Exception as exc:  # keep the original error; report the cleanup problem
            log.warning("cleanup after a failed lab up was incomplete: %s", exc)
        raise
    return state


def _refuse_if_up() -> None:
    existing = load_state()
    leftovers = network.list_namespaces() or (
        [network.BRIDGE] if network.BRIDGE in network.list_links() else []
    )
    if existing or leftovers:
        raise TracrError(
            "a tracr lab is already up on this machine"
            + (f" ({', '.join(leftovers)})" if leftovers else ""),
            hint="'tracr lab ls' shows it; 'tracr lab down' removes it (run it with the same "
            "TRACR_CONFIG_DIR that brought it up)",
        )


def _build(
    state: dict, n: int, quotas: dict[str, float], say, period: int | None = None,
    pin: bool = True, duty: int | None = None,
) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    state["pinned"] = bool(pin) and n <= len(cpus)
    if pin and not state["pinned"]:
        say(f"not pinning: {n} hosts on {len(cpus)} CPUs (hosts share the cores)")
    secrets = lab_state.ensure_lab_dirs()
    # The key pair is made where only root can write, then the private half is handed to
    # the user (their file, 0600); sshd trusts only the root-only authorized_keys.
    made = secrets / "client_ed25519"
    client_pub = sshd.make_key(made, "tracr-lab-client")
    client_key = lab_state.client_key_path()
    fsutil.atomic_write(client_key, made.read_bytes(), mode=0o600)
    fsutil.atomic_write(client_key.with_name(client_key.name + ".pub"), client_pub + "\n")
    made.unlink()
    state["client_key"] = str(client_key)
    authorized = secrets / "authorized_keys"
    fsutil.atomic_write(authorized, client_pub + "\n", mode=0o600, for_user=False)
    save_state(state)

    state["bridge_created"] = True
    save_state(state)
    network.create_bridge()
    say(f"bridge {network.BRIDGE} {network.BRIDGE_ADDRESS}/24")

    kh_lines = []
    for i in range(1, n + 1):
        names = network.host_names(i)
        h = host_entry(state, names["name"])
        h.update(names)
        save_state(state)  # record the names before creating, so down finds half-made hosts
        network.create_host(names)
        host_dir = lab_state.host_dir(names["name"])
        host_dir.mkdir(mode=0o700, exist_ok=True)
        host_key = host_dir / "ssh_host_ed25519_key"
        pub = sshd.make_key(host_key, f"tracr-lab-{names['name']}")
        config = sshd.write_config(host_dir, names["address"], host_key, authorized)
        h.update(dir=str(host_dir), host_key=str(host_key), sshd_config=str(config))
        if names["name"] in quotas:
            fraction = quotas[names["name"]]
            # paced, the cgroup caps the host at one core (a device's one CPU), the pacer
            # at its fraction of CPU time
            path = cgroup.create(names["ns"], max(1.0, fraction) if duty else fraction, period)
            h.update(
                cgroup=str(path),
                cpu_quota=fraction,
                cpu_mode="duty" if duty else "quota",
                cpu_period_us=duty or cgroup.read_period_us(path)
                or cgroup.host_period_us(fraction, period),
            )
            save_state(state)
        pid = sshd.start_sshd(names["ns"], config, host_dir / "sshd.log")
        h["sshd_pid"] = pid
        if state["pinned"]:
            # before sshd forks anything: every session (and participant) inherits the CPU
            os.sched_setaffinity(pid, {cpus[i - 1]})
            h["cpus"] = [cpus[i - 1]]
        save_state(state)
        if h.get("cgroup"):
            # sshd has not forked anything yet; every session it starts inherits the cgroup.
            cgroup.add_pid(Path(h["cgroup"]), pid)
        sshd.wait_listening(names["address"], 22, pid=pid)
        kh_lines.append(sshd.host_key_line(names["address"], pub))
        say(f"{names['name']}: netns {names['ns']} {names['address']} sshd pid {pid}"
            + (f", CPU {h['cpus'][0]}" if h.get("cpus") else ""))

    kh = Path(state["known_hosts"])
    sshd.add_known_hosts(kh, kh_lines)
    state["known_hosts_lines"] = kh_lines
    save_state(state)
    state["registry"] = register_hosts(state)
    save_state(state)
    if duty:
        _start_pacer(state, duty, say)

    limited = [h for h in state["hosts"] if h.get("cgroup")]
    for h in limited:
        share = cgroup.measure_share(Path(h["cgroup"]), h["ns"], seconds=1.0)
        h["cpu_measured"] = round(share, 3)
        say(
            f"{h['name']}: cpu {'paced at' if duty else 'quota'} {h['cpu_quota']:g} core "
            f"per {h['cpu_period_us'] / 1000:g} ms {'tick' if duty else 'period'}, "
            f"busy loop got {share:.3f}"
        )
    if len(limited) > 1:
        # what each gets while every one is busy (a pipeline in throughput mode): the
        # hosts share the machine's CPUs with each other and with the pacer
        shares = cgroup.measure_shares([(Path(h["cgroup"]), h["ns"]) for h in limited],
                                       seconds=2.0)
        for h, share in zip(limited, shares, strict=True):
            h["cpu_measured_together"] = round(share, 3)
        say("all busy at once, busy loops got " + ", ".join(
            f"{h['name']} {h['cpu_measured_together']:.3f}" for h in limited)
            + f" (sum {sum(shares):.2f} of {os.cpu_count()} CPUs)")
    save_state(state)


CPU_MODES = ("quota", "duty")


def pacer_period_us(period_ms: float | None) -> int:
    """The pacer's tick in us (None: the default 1 ms), range-checked."""
    if period_ms is None:
        return pacer.DEFAULT_PERIOD_US
    us = int(round(float(period_ms) * 1000))
    if not pacer.MIN_PERIOD_US <= us <= pacer.MAX_PERIOD_US:
        raise TracrError(
            f"--cpu-period-ms for --cpu-mode duty must be between "
            f"{pacer.MIN_PERIOD_US / 1000:g} and {pacer.MAX_PERIOD_US / 1000:g} ms, not {period_ms}")
    return us


def _start_pacer(state: dict, period: int, say) -> None:
    paced = [(h["cgroup"], float(h["cpu_quota"])) for h in state["hosts"] if h.get("cgroup")]
    log_path = lab_state.lab_dir() / "pacer.log"
    pid = pacer.start(paced, period, lab_state.state_path(), log_path)
    state["pacer"] = {"pid": pid, "period_us": period, "log": str(log_path)}
    save_state(state)
    deadline = time.monotonic() + 10.0
    ready = f"{pacer.READY} {pid}:"
    # wait until it paces, not only until it runs: the shares measured next are what the
    # hosts get (measured during its start-up, a 0.25 host's busy loop got 0.28)
    while not (pacer.is_ours(pid, lab_state.state_path()) and logged(log_path, ready)):
        if not pid_alive(pid):
            raise TracrError(f"the lab's CPU pacer exited at start-up; see {log_path}")
        if time.monotonic() > deadline:
            raise TracrError(f"the lab's CPU pacer did not start pacing within 10 s; see "
                             f"{log_path}")
        time.sleep(0.02)
    say(f"pacer pid {pid}: " + ", ".join(f"{h['name']} at {h['cpu_quota']:g} core"
                                         for h in state["hosts"] if h.get("cgroup"))
        + f" of CPU time, checked every {period / 1000:g} ms")


def _stop_pacers(namespaces: set[str]) -> list[int]:
    """Stop the lab's pacer(s) and continue every process in ``namespaces`` (one may have
    been left stopped by a pacer that was killed)."""
    stopped = [p for p in pacer.find(lab_state.state_path()) if stop_pid(p, timeout=3.0)]
    pacer.continue_pids(sorted(p for ns in namespaces for p in network.ns_pids(ns)))
    return stopped


def link_request(bandwidth=None, delay_ms=None, *, jitter=None, jitter_dist: str = "uniform",
                 loss=None, loss_model: str | None = None, queue=None, trace: str | None = None,
                 link_mode: str = "auto", overrides: dict | None = None) -> dict:
    """The lab's link as asked (recorded in the state, so a run can put it back).

    ``overrides``: ``{"lab-2:down": {"delay": "5ms", ...}}``, per host and direction.
    """
    return {"bandwidth": None if bandwidth in (None, "") else str(bandwidth),
            "delay_ms": links.parse_ms(delay_ms, "delay") or None, "jitter": jitter,
            "jitter_dist": jitter_dist, "loss": loss, "loss_model": loss_model, "queue": queue,
            "trace": trace, "link_mode": link_mode or "auto", "overrides": overrides or {}}


def _link_spec(request: dict, hosts: list[str]) -> tuple[dict, str]:
    keys = ("bandwidth", "jitter", "jitter_dist", "loss", "loss_model", "queue", "trace")
    egress = links.direction_config(delay=request.get("delay_ms"),
                                    **{k: request.get(k) for k in keys if k in request})
    overrides = {}
    for where, values in (request.get("overrides") or {}).items():
        host, _, direction = where.partition(":")
        unknown = sorted(set(values) - {*keys, "delay"})
        if unknown:
            raise TracrError(f"--link {where}: unknown key {unknown[0]!r}",
                             hint="keys: bandwidth, delay, jitter, jitter_dist, loss, "
                             "loss_model, queue, trace")
        overrides[(host, direction or "up")] = links.direction_config(**values)
    return links.link_spec(hosts, egress, overrides), request.get("link_mode") or "auto"


def _apply(state: dict, request: dict, verify: bool, say) -> None:
    spec, mode = _link_spec(request, [h["name"] for h in state["hosts"]])
    mechanism = links.apply(state, spec, mode, say)
    egress = spec[state["hosts"][0]["name"]]["up"]
    state["shaping"] = {
        "bandwidth": request.get("bandwidth"),
        "bandwidth_Bps": egress.rate_Bps,
        "delay_ms": request.get("delay_ms"),
        "qdisc": mechanism,
        "mechanism": mechanism,
        "request": request,
        "where": "egress of every host (namespace end of its veth)"
        + ("; per-host overrides in links" if request.get("overrides") else ""),
    }
    state["measured"] = {}
    state.pop("verify", None)  # a new link: the last verify no longer holds
    save_state(state)
    if mechanism:
        say(f"shaping: {mechanism} " + ", ".join(
            f"{h['name']} {links.describe(spec[h['name']]['up'])}" for h in state["hosts"]))
    if verify:
        state["measured"] = verify_link(state)
        m = state["measured"]
        say(
            f"measured {m['src']} -> {m['dst']}: {format_rate(m['rate_Bps'])}, rtt {m['rtt_ms']:.3f} ms"
        )
        save_state(state)


def verify_link(state: dict) -> dict:
    """Measure rate and round trip between the first two hosts (or host 1 -> observer)."""
    hosts = state["hosts"]
    shaped = state.get("shaping", {}).get("bandwidth_Bps")
    seconds = 2.0 if shaped else 1.0
    if shaped and shaped < 200_000:
        seconds = 4.0  # slow links need longer for the steady state to dominate
    src = hosts[0]
    if len(hosts) >= 2:
        dst_name, dst_ns, dst_addr = hosts[1]["name"], hosts[1]["ns"], hosts[1]["address"]
    else:
        dst_name, dst_ns, dst_addr = "observer", None, state["bridge_address"]
    result = measure_link(src["ns"], dst_ns, dst_addr, seconds=seconds)
    # A shaped link cannot beat its rate, but a stalled machine can read far below it for
    # a whole probe. Probe again (twice at most) and keep the fastest reading, so one
    # stall does not hand the partitioners a wrong link; every reading is recorded.
    readings = [round(result["rate_Bps"])]
    while shaped and result["rate_Bps"] < 0.7 * shaped and len(readings) < 3:
        again = measure_link(src["ns"], dst_ns, dst_addr, seconds=seconds)
        readings.append(round(again["rate_Bps"]))
        if again["rate_Bps"] > result["rate_Bps"]:
            result = again
    result["rate_readings_Bps"] = readings
    result.update(
        src=src["name"], dst=dst_name, seconds=seconds, at=time.strftime("%Y-%m-%dT%H:%M:%S%z")
    )
    if shaped:
        result["rate_ratio"] = round(result["rate_Bps"] / shaped, 4)
    return result


def shape(
    bandwidth: str | float | None = None,
    delay_ms: float | None = None,
    *,
    verify: bool = True,
    say=lambda m: None,
    wait_s: float = WAIT_S,
    **link_args,
) -> dict:
    """Re-shape the running lab (None/None removes shaping) and re-measure; returns link_report().

    ``link_args`` as for :func:`up`; one not given keeps the lab's current value (``tracr
    lab shape`` gives them all). Holds the lab link's lock
    (:func:`app_api.lab.lock.link_lock`) while it shapes and measures; another holder is
    waited for at most ``wait_s`` seconds.
    """
    require_root()
    state = load_state()
    if not state or not state.get("hosts"):
        raise TracrError(
            "no tracr lab is up", hint="start one: tracr lab up --hosts 2 --bandwidth 4MB/s"
        )
    # what is not given is kept (a run that re-shapes the rate keeps the lab's loss model)
    current = (state.get("shaping") or {}).get("request") or {}
    for key in ("jitter", "jitter_dist", "loss", "loss_model", "queue", "trace", "link_mode",
                "overrides"):
        if key not in link_args and key in current:
            link_args[key] = current[key]
    request = link_request(bandwidth, delay_ms, **link_args)
    spec, mode = _link_spec(request, [h["name"] for h in state["hosts"]])
    links.choose_mechanism(spec, mode)
    with link_lock(wait_s):
        state = load_state() or state  # re-read: another shaper may have finished meanwhile
        _apply(state, request, verify, say)
    return link_report()


def link_report() -> dict:
    """The lab link as configured and as measured ({} when no lab is up).

    Top-level ``bandwidth_Bps``/``rtt_ms`` are the measured figures (the shape partitioners
    expect); ``configured`` and ``measured`` hold the details.
    """
    state = load_state()
    if not state:
        return {}
    measured = dict(state.get("measured") or {})
    return {
        "lab": True,
        "hosts": [h["name"] for h in state["hosts"]],
        "bandwidth_Bps": measured.get("rate_Bps"),
        "rtt_ms": measured.get("rtt_ms"),
        "configured": dict(state.get("shaping") or {}),
        "measured": measured,
        # per host and direction, and the last `tracr lab verify` (a run records both)
        "links": state.get("links"),
        "verify": state.get("verify"),
        "cpu": {
            h["name"]: {
                "quota": h.get("cpu_quota"),
                "measured": h.get("cpu_measured"),
                "mode": h.get("cpu_mode", "quota"),
                # labs brought up before the period was recorded used the old 100 ms default
                "period_us": h.get("cpu_period_us", 100_000),
                **({"measured_together": h["cpu_measured_together"]}
                   if h.get("cpu_measured_together") is not None else {}),
            }
            for h in state["hosts"]
            if h.get("cpu_quota") is not None
        },
        "cpus": {h["name"]: h.get("cpus") for h in state["hosts"]},
    }


def status() -> dict | None:
    """The state plus live checks (sshd alive, namespace present), for ``tracr lab ls``."""
    state = load_state()
    if state is None:
        return None
    present = set(network.list_namespaces())
    for h in state["hosts"]:
        h["alive"] = pid_alive(h.get("sshd_pid")) and h.get("ns") in present
        h["ns_present"] = h.get("ns") in present
    if state.get("pacer"):
        state["pacer"]["alive"] = pacer.is_ours(state["pacer"].get("pid"), lab_state.state_path())
    if state.get("emulator"):
        state["emulator"]["alive"] = links.emulator_alive(state)
    return state


def down(*, say=lambda msg: None) -> dict:
    """Remove everything the lab created and can prove is its own (idempotent).

    Returns what was removed, by kind; ``removed["refused"]`` lists what was not trusted
    (a forged or tampered state file, an older version's state in the user's directory).
    """
    require_root()
    refused: list[str] = []
    try:
        state = load_state()
    except TracrError as exc:
        refused.append(str(exc))
        state = None  # unreadable: fall back to finding things by name
    if state is not None:
        problems = lab_state.validate_state(state, known_hosts_path())
        if problems:
            refused.append(
                f"the lab state file {lab_state.state_path()} is not what 'lab up' writes for "
                f"this user ({'; '.join(problems[:5])}{' ...' if len(problems) > 5 else ''}): "
                "a lab started with another TRACR_CONFIG_DIR, or a tampered file; it was "
                "ignored and only what is found by the lab's own names was removed"
            )
            state = None
    state = state or new_state()
    removed: dict[str, list] = {
        k: []
        for k in ("processes", "namespaces", "links", "cgroups", "registry", "known_hosts", "files")
    }

    namespaces = {h["ns"] for h in state["hosts"] if h.get("ns")} | set(network.list_namespaces())
    removed["processes"].extend(_stop_pacers(namespaces))
    removed["processes"].extend(links.stop_emulator(state))
    for h in state["hosts"]:
        pid = h.get("sshd_pid")
        if pid and _our_sshd(h) and stop_pid(pid):
            removed["processes"].append(pid)
    for ns in sorted(namespaces):
        # Only processes inside our own namespaces: sessions, participants, probes.
        for pid in network.ns_pids(ns):
            if stop_pid(pid, timeout=3.0):
                removed["processes"].append(pid)
    for ns in sorted(namespaces):
        if network.delete_namespace(ns):
            removed["namespaces"].append(ns)
    devices = {h.get("veth_host") for h in state["hosts"]} | set(network.list_links())
    devices.discard(None)
    for link in sorted(devices, key=lambda x: x == network.BRIDGE):  # bridge last
        if network.delete_link(link):
            removed["links"].append(link)
    if network.delete_link(network.BRIDGE):
        removed["links"].append(network.BRIDGE)

    groups = {h.get("cgroup") for h in state["hosts"] if h.get("cgroup")} | _our_cgroups()
    for path in sorted(groups):
        if cgroup.remove(path):
            removed["cgroups"].append(path)

    removed["registry"] = unregister_hosts(state)
    removed["known_hosts"] = _forget_host_keys(state, refused)
    removed["files"] = _remove_files(refused)
    removed["refused"] = refused
    for kind, items in removed.items():
        if items and kind != "refused":
            say(f"removed {kind}: {', '.join(map(str, items))}")
    return removed


def _our_sshd(h: dict) -> bool:
    """True if host ``h``'s recorded sshd PID still is the sshd we started in its namespace
    (a reused PID, or a PID written into the state by someone else, is never killed)."""
    try:
        want = lab_state.expected_host(h.get("name"))
    except ValueError:
        return False
    pid = h.get("sshd_pid")
    return (
        h.get("ns") == want["ns"]
        and pid in network.ns_pids(want["ns"])
        and sshd.is_our_sshd(pid, want["sshd_config"], want["sshd_log"])
    )


def _forget_host_keys(state: dict, refused: list[str]) -> list[str]:
    """Drop the lab's host keys from tracr's known_hosts (recorded lines, else the subnet's)."""
    path = known_hosts_path()
    recorded = {line.split()[0] for line in state.get("known_hosts_lines") or []}
    subnet = {f"{network.SUBNET_PREFIX}.{i + 1}" for i in range(1, network.MAX_HOSTS + 1)}
    hosts = recorded or subnet
    try:
        if sshd.remove_known_hosts(path, hosts):
            return sorted(recorded) if recorded else [f"{network.SUBNET_PREFIX}.*"]
    except (OSError, TracrError) as exc:
        refused.append(f"could not edit {path}: {exc}")
    return []


def _remove_files(refused: list[str]) -> list[str]:
    """Remove the lab's root directory and, from the user's lab dir, only the files tracr
    writes there (by name; links are removed, never followed)."""
    removed: list[str] = []
    root = lab_state.lab_dir()
    if os.path.lexists(root):
        remove_state()
        if root.is_symlink():
            os.unlink(root)
        else:
            shutil.rmtree(root, ignore_errors=True)  # fd-based: links inside are not followed
        removed.append(str(root))
    user_dir = lab_state.client_dir()
    legacy = [p for p in lab_state.legacy_files() if os.path.lexists(p)]
    if any(p.name == "state.json" for p in legacy):
        refused.append(f"an older tracr's lab state {user_dir / 'state.json'} was not trusted "
                       "(it sits in a directory you can write); it was deleted")
    key = lab_state.client_key_path()
    for path in [key, key.with_name(key.name + ".pub"), *legacy]:
        if fsutil.unlink(path):
            removed.append(str(path))
    for sub in {p.parent for p in legacy if p.parent != user_dir}:
        with contextlib.suppress(OSError):
            os.rmdir(sub)
    with contextlib.suppress(OSError):
        if os.path.isdir(user_dir) and not os.path.islink(user_dir):
            os.rmdir(user_dir)  # only when empty: what else the user keeps there stays
            removed.append(str(user_dir))
    return removed


def _our_cgroups() -> set[str]:
    out: set[str] = set()
    for base in (cgroup.CGROUP_ROOT / "cpu", cgroup.CGROUP_ROOT):
        if base.is_dir():
            out |= {str(p) for p in base.glob(f"{network.NS_PREFIX}*") if p.is_dir()}
    return out
