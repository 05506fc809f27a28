"""Measuring the link under a data channel on this side's clock: rtt, bandwidth, CPU per byte.

The prober sends :data:`PROBE_OP` messages and reads :data:`PROBE_ACK_OP` replies; its
peer sits in :meth:`~experiment_design.transport.channel.DataChannel.recv`, which answers
each probe on the way (with its process's CPU clock) and never returns it. ``ch`` below is
that channel (typed ``Any`` here: the channel imports this module).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from experiment_design.errors import TracrError
from experiment_design.transport.codec import now_ms
from experiment_design.transport.codec_config import RAW
from experiment_design.transport.errors import TransportError

PROBE_OP = "__probe__"
PROBE_ACK_OP = "__probe_ack__"


def _probe_once(ch: Any, payload: torch.Tensor | None) -> tuple[float, float, float | None]:
    """One probe round trip: (wall ms, this process's CPU ms, the peer's CPU clock in
    ms when it acknowledged, or None from a peer that does not say)."""
    c0 = time.process_time_ns()
    t0 = now_ms()
    ch.send({"op": PROBE_OP}, {"p": payload} if payload is not None else None, codec=RAW)
    header, _, _ = ch.recv_frame()
    t1 = now_ms()
    cpu = (time.process_time_ns() - c0) / 1e6
    if header.get("op") != PROBE_ACK_OP:
        raise TransportError(f"expected a probe acknowledgement, got op {header.get('op')!r}")
    peer = header.get("cpu_ms")
    return t1 - t0, cpu, float(peer) if isinstance(peer, (int, float)) else None


def probe_link(
    ch: Any, sizes: tuple[int, ...] = (65536, 1048576), rounds: int = 3
) -> dict[str, Any]:
    """Measure the link to the peer on this side's clock (the peer must be in
    :meth:`DataChannel.recv`, which answers the probes).

    ``rtt_ms`` is the median round trip of an empty message; for each payload size the
    round trip minus that rtt is the time the bytes took, and ``bandwidth_Bps`` is read
    from the largest size. Payloads go raw so the codec does not distort the figure.
    The first round trip is a warm-up and is not counted.

    ``send_ns_per_byte`` / ``recv_ns_per_byte``: the CPU time a byte costs the sending
    process (this one) and the receiving one (the peer's CPU clock rides on its
    acknowledgements), from the largest size against empty messages; None from a peer
    that does not report its clock. Over a real TCP link that is the network stack's
    work too: on the lab's 32 MB/s veth links 0.5-0.9 ns/B to send and 0.8-1.5 to
    receive.
    """
    if rounds < 1 or not sizes:
        raise TracrError("probe needs at least one round and one size")
    last_peer = _probe_once(ch, None)[2]  # warm-up: connection and code paths

    def rounds_of(payload: torch.Tensor | None) -> tuple[list[float], list[float], list]:
        nonlocal last_peer
        walls, cpus, peers = [], [], []
        for _ in range(rounds):
            wall, cpu, peer = _probe_once(ch, payload)
            walls.append(wall)
            cpus.append(cpu)
            peers.append(None if peer is None or last_peer is None else peer - last_peer)
            last_peer = peer
        return walls, cpus, peers

    small, small_cpu, small_peer = rounds_of(None)
    rtt = statistics.median(small)
    samples: list[dict[str, Any]] = [{"bytes": 0, "ms": ms} for ms in small]
    bandwidth = 0.0
    send_cost = recv_cost = None
    for size in sorted(sizes):
        payload = torch.zeros(int(size), dtype=torch.uint8)
        times, cpus, peers = rounds_of(payload)
        samples.extend({"bytes": int(size), "ms": ms} for ms in times)
        med = statistics.median(times)
        transfer = med - rtt if med > rtt else med
        bandwidth = size / (transfer / 1e3)
        send_cost = _per_byte(cpus, small_cpu, size)
        recv_cost = _per_byte(peers, small_peer, size)
    return {"bandwidth_Bps": bandwidth, "rtt_ms": rtt, "send_ns_per_byte": send_cost,
            "recv_ns_per_byte": recv_cost, "samples": samples}


def _per_byte(big: list, small: list, size: int) -> float | None:
    """CPU ns per byte: the median CPU ms of rounds carrying ``size`` bytes less that of
    empty ones (None where a round has no figure)."""
    if not size or any(v is None for v in (*big, *small)):
        return None
    return max(0.0, statistics.median(big) - statistics.median(small)) * 1e6 / size
