"""Namespaces, veth pairs, the bridge and ``tc`` shaping of the emulated lab.

Layout (N hosts)::

    root namespace:  trlab-br0 10.213.0.1/24  (the observer reaches hosts through it)
                       |-- trlab-1h  <veth>  trlab-1n 10.213.0.2  [netns tracr-lab-1]
                       |-- trlab-2h  <veth>  trlab-2n 10.213.0.3  [netns tracr-lab-2]

Shaping sits on each host's egress (the namespace end of its veth), so traffic between
two hosts is shaped once per direction. Traffic from the observer to a host is not shaped;
traffic from a host to the observer is.
"""

from __future__ import annotations

import json
import logging
import re

from app_api.lab.system import ok, run
from experiment_design.errors import TracrError

log = logging.getLogger(__name__)

NS_PREFIX = "tracr-lab-"
LINK_PREFIX = "trlab-"
BRIDGE = "trlab-br0"
SUBNET_PREFIX = "10.213.0"
BRIDGE_ADDRESS = f"{SUBNET_PREFIX}.1"
BRIDGE_MAC = "02:74:72:6c:62:01"  # locally administered; fixed (see create_bridge)
MAX_HOSTS = 200


def host_names(i: int) -> dict:
    """Names and address of lab host ``i`` (1-based)."""
    return {
        "name": f"lab-{i}",
        "ns": f"{NS_PREFIX}{i}",
        "address": f"{SUBNET_PREFIX}.{i + 1}",
        "veth_host": f"{LINK_PREFIX}{i}h",
        "veth_ns": f"{LINK_PREFIX}{i}n",
        # the link emulator's pair (app_api.lab.links.wire_user): x is relayed, y bridged
        "veth_emu": f"{LINK_PREFIX}{i}x",
        "veth_bridge": f"{LINK_PREFIX}{i}y",
    }


def list_namespaces() -> list[str]:
    """Our namespaces (``tracr-lab-<n>``) present on this machine."""
    out = run(["ip", "netns", "list"], check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if re.fullmatch(rf"{NS_PREFIX}\d+", n)]


def list_links() -> list[str]:
    """Our links (``trlab-*``) in the root namespace."""
    out = run(["ip", "-j", "link", "show"], check=False).stdout or "[]"
    try:
        links = json.loads(out)
    except json.JSONDecodeError:
        return []
    return [link["ifname"] for link in links if link.get("ifname", "").startswith(LINK_PREFIX)]


def ns_pids(ns: str) -> list[int]:
    """PIDs of processes inside namespace ``ns`` (empty if it does not exist)."""
    out = run(["ip", "netns", "pids", ns], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def create_bridge() -> None:
    """Create ``trlab-br0`` with the observer's address on the lab subnet.

    Its MAC address is set, so it stays the same as ports come and go: a bridge takes the
    lowest of its ports' addresses, and when the link emulator took a host's veth off the
    bridge, that host still sent the observer's frames to the veth's own address, which
    the root namespace took in directly, past the emulator."""
    run(["ip", "link", "add", BRIDGE, "address", BRIDGE_MAC, "type", "bridge"])
    run(["ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])


def create_host(h: dict) -> None:
    """Create the namespace, the veth pair into it, addresses and ``lo`` for host ``h``."""
    ns, vh, vn = h["ns"], h["veth_host"], h["veth_ns"]
    run(["ip", "netns", "add", ns])
    run(["ip", "link", "add", vh, "type", "veth", "peer", "name", vn])
    run(["ip", "link", "set", vn, "netns", ns])
    run(["ip", "link", "set", vh, "master", BRIDGE])
    run(["ip", "link", "set", vh, "up"])
    nsx = ["ip", "netns", "exec", ns]
    run([*nsx, "ip", "link", "set", "lo", "up"])
    run([*nsx, "ip", "addr", "add", f"{h['address']}/24", "dev", vn])
    run([*nsx, "ip", "link", "set", vn, "up"])


def delete_namespace(ns: str) -> bool:
    """Delete namespace ``ns`` (its veth ends go with it); True if it existed."""
    return ok(["ip", "netns", "del", ns])


def delete_link(name: str) -> bool:
    """Delete a root-namespace link; True if it existed."""
    return ok(["ip", "link", "del", name])


#: Bytes the shaper may queue. Deep enough that TCP never loses a packet to it: Linux
#: lets one flow have at most its send buffer in flight (``tcp_wmem`` max, 4 MiB by
#: default), so every request-response transfer fits, for a few flows at once.
QUEUE_BYTES = 16 << 20


def tbf_params(rate_Bps: float, *, mtu: int = 1500, queue_bytes: int = QUEUE_BYTES) -> dict:
    """Parameters for a ``tbf`` qdisc shaping to ``rate_Bps`` (bytes/s on the wire).

    ``burst`` (the bucket) is 2 ms worth of traffic but never less than one full frame
    (the least that lets a full-size packet through). The bucket refills while the link
    idles and is then sent at line rate, so every transfer after an idle spell gets its
    first ``burst`` bytes for free: 2 ms keeps that error small while TCP still reaches
    ~95% of the rate in payload. (A floor of four frames made it 6 KB, 6.3 ms at 1 MB/s:
    a 5 KB tensor crossed in 0.17 ms instead of 5.4, and 20-100 KB ones 5.8 ms early;
    with one frame the link measured the same 95.6% of the rate.)
    ``limit`` (the queue) is one bucket plus ``queue_bytes``, so a transfer takes
    bytes / rate however large it is. With a shallow queue (50 ms of traffic) the tail
    of every transfer larger than the queue was dropped and TCP recovered by
    retransmission timeout (>= 200 ms): on a 1 MB/s link a 62 KB tensor took 200 ms
    instead of 63 ms, and the time stopped growing with the bytes.
    Returned as integers plus the ready ``tc`` argument list.
    """
    if not rate_Bps > 0:
        raise TracrError(f"cannot shape to a rate of {rate_Bps} bytes/s")
    frame = mtu + 14
    burst = max(frame, int(rate_Bps * 0.002))
    limit = burst + max(2 * frame, int(queue_bytes))
    rate_bit = int(round(rate_Bps * 8))
    return {
        "rate_bit": rate_bit,
        "burst": burst,
        "limit": limit,
        "args": ["tbf", "rate", f"{rate_bit}bit", "burst", str(burst), "limit", str(limit)],
    }


_QDISC_CACHE: dict[str, bool] = {}


def netem_available() -> bool:
    """Whether this kernel has the ``netem`` qdisc (tried once per process on a throwaway veth)."""
    if "netem" in _QDISC_CACHE:
        return _QDISC_CACHE["netem"]
    a, b = f"{LINK_PREFIX}probe0", f"{LINK_PREFIX}probe1"
    delete_link(a)
    run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])
    try:
        have = ok(["tc", "qdisc", "add", "dev", a, "root", "netem", "delay", "1ms"])
    finally:
        delete_link(a)
    _QDISC_CACHE["netem"] = have
    return have


def apply_shaping(h: dict, plan: dict) -> None:
    """Put ``plan`` on host ``h``'s egress, replacing whatever shaping was there."""
    base = ["ip", "netns", "exec", h["ns"], "tc", "qdisc"]
    # Deleting the root qdisc restores the default; it fails harmlessly when there is none.
    ok([*base, "del", "dev", h["veth_ns"], "root"])
    if plan["qdisc"]:
        run([*base, "add", "dev", h["veth_ns"], "root", *plan["args"]])


def show_qdisc(h: dict) -> str:
    """``tc qdisc show`` of host ``h``'s egress, for ``lab ls`` and debugging."""
    out = run(
        ["ip", "netns", "exec", h["ns"], "tc", "qdisc", "show", "dev", h["veth_ns"]], check=False
    )
    return out.stdout.strip()
