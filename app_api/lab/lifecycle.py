"""Bringing the emulated lab up, and its status.

Every resource is recorded in the state file right after it is created, so
:func:`app_api.lab.teardown.down` undoes exactly what :func:`up` did, even when ``up``
stopped half way (``up`` calls it itself when it fails). The link is shaped and measured
by :mod:`app_api.lab.shaping`; the hosts' CPU quotas are checked here.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from app_api import fsutil
from app_api.devices.registry import known_hosts_path
from app_api.lab import cgroup, links, network, pacer, sshd
from app_api.lab import memory as lab_memory
from app_api.lab import state as lab_state
from app_api.lab.holds import HOLDS_FILE
from app_api.lab.registry_link import register_hosts
from app_api.lab.shaping import apply_request, link_request, request_spec
from app_api.lab.state import host_entry, load_state, new_state, save_state
from app_api.lab.system import logged, pid_alive, require_root
from app_api.lab.teardown import down
from experiment_design.errors import TracrError, UnknownNameError

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
    memory: list[str] | dict | None = None,
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

    ``link_args`` shape the links beyond rate and delay
    (:func:`app_api.lab.shaping.link_request`: ``jitter``,
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
    caps = lab_memory.parse_limits(memory, int(hosts))  # host -> bytes (app_api.lab.memory)
    if caps:
        lab_memory.base()  # fails early with a hint when there is no memory controller
    if duty and not quotas:
        raise TracrError("--cpu-mode duty paces the hosts given a --cpu-quota; none was given")
    if quotas:
        cgroup.cgroup_path(
            "tracr-lab-probe"
        )  # fails early with a hint when there is no cpu controller
    sshd.sshd_binary()
    request = link_request(bandwidth, delay_ms, **link_args)
    spec, mode = request_spec(request, [f"lab-{i}" for i in range(1, int(hosts) + 1)])
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
        lab_memory.apply(state, caps, say)  # before any session: they inherit the caps
        save_state(state)
        apply_request(state, request, verify, say)
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
    holds = lab_state.lab_dir() / HOLDS_FILE
    pid = pacer.start(paced, period, lab_state.state_path(), log_path, holds)
    state["pacer"] = {"pid": pid, "period_us": period, "log": str(log_path),
                      "holds": str(holds)}
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
