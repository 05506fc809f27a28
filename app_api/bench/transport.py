"""`tracr bench transport`: the participant data path versus a raw TCP socket, on loopback.

A peer runs in a separate process (``python -m experiment_design.transport.peer``) and
serves both a tracr data channel and a bare TCP receiver. This process then measures,
interleaved round by round so that a busy machine slows both sides alike:

1. throughput: one large float32 tensor through :class:`DataChannel` (ended by the
   peer's ack frame; every frame carries its AES-GCM integrity tag) versus the same
   bytes written with ``sendall`` to a receiver that ``recv_into``'s them into a fresh
   buffer and answers one byte; the same tensor through an encrypted channel is a third
   step of each round (``encrypted``);
2. round trip: a 1x10 float32 tensor echoed through :class:`DataChannel` versus the
   same 40 bytes echoed over the raw socket.

Every time is read on this process's clock (a round trip), medians over the measured
rounds, warm-up rounds discarded. MB means 10^6 bytes.

The transport loads torch, so it is imported inside the functions that use it, for
start-up time: ``tracr --help`` imports this module to list the benchmark's arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import select
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Any

from experiment_design.errors import TracrError

TARGETS = {"throughput_ratio": ">= 0.8", "rtt_ratio": "<= 1.5"}
REPO = Path(__file__).resolve().parents[2]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `tracr bench transport` (``--json`` comes from the bench command)."""
    parser.add_argument(
        "--size-mb", type=float, default=10.0, help="tensor size for throughput (10^6 bytes)"
    )
    parser.add_argument(
        "--repeats", type=int, default=20, help="measured throughput rounds per side"
    )
    parser.add_argument(
        "--rtt-rounds",
        type=int,
        default=0,
        help="measured round trips per side (default 10 x repeats)",
    )
    parser.add_argument(
        "--warmup", type=int, default=3, help="discarded rounds per side before measuring"
    )
    parser.add_argument(
        "--codec",
        default="none",
        choices=["none", "zstd", "lz4", "lz4hc", "blosclz", "zlib"],
        help="codec of the compared tracr path (none: same bytes as the raw socket)",
    )
    parser.add_argument("--level", type=int, default=1, help="codec level for compressed figures")
    parser.add_argument("--no-compressed", action="store_true", help="skip the extra zstd figures")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the peer on threads of this process (quick self-check; figures share one GIL)",
    )


def _start_peer(secret: bytes) -> tuple[subprocess.Popen, dict[str, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "experiment_design.transport.peer", "--host", "127.0.0.1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(secret.hex() + "\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if line.startswith("TRACR-PEER "):
                return proc, json.loads(line.split(" ", 1)[1])
            if not line:
                break
        if proc.poll() is not None:
            break
    _stop_peer(proc)
    err = proc.stderr.read() if proc.stderr else ""
    raise TracrError("the transport bench peer did not start", hint=err.strip()[-500:] or None)


def _stop_peer(proc: subprocess.Popen) -> None:
    try:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _deciles(xs: list[float]) -> list[float]:
    if len(xs) < 2:
        return [xs[0], xs[0]] if xs else [float("nan")] * 2
    cuts = statistics.quantiles(xs, n=10)
    return [cuts[0], cuts[-1]]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark and return the figures (see the module docstring)."""
    import socket

    import torch

    from experiment_design.transport import CodecConfig, connect

    size_mb = float(getattr(args, "size_mb", 10.0))
    repeats = int(getattr(args, "repeats", 20))
    warmup = int(getattr(args, "warmup", 3))
    rtt_rounds = int(getattr(args, "rtt_rounds", 0) or 10 * repeats)
    codec_name = getattr(args, "codec", "none")
    level = int(getattr(args, "level", 1))
    compressed = not getattr(args, "no_compressed", False)
    if size_mb <= 0 or repeats < 1 or warmup < 0:
        raise TracrError("--size-mb must be > 0, --repeats >= 1 and --warmup >= 0")

    torch.set_num_threads(1)
    main_codec = CodecConfig(
        codec=codec_name, level=level if codec_name != "none" else 0, filter="shuffle"
    )
    zstd = CodecConfig(codec="zstd", level=level, filter="shuffle")
    n_elems = max(1, int(size_mb * 1e6) // 4)
    gen = torch.Generator().manual_seed(0)
    # Activations after a ReLU: about half zeros, so compressed figures mean something.
    big = torch.relu(torch.randn(n_elems, generator=gen))
    nbytes = big.numel() * 4
    small = torch.randn(1, 10, generator=gen)

    secret = os.urandom(32)
    in_process = bool(getattr(args, "in_process", False))
    if in_process:
        from experiment_design.transport.peer import start

        ports, stop = start("127.0.0.1", secret)
    else:
        proc, ports = _start_peer(secret)
        stop = partial(_stop_peer, proc)
    try:
        ch = connect("127.0.0.1", ports["data_port"], secret, main_codec)
        enc_codec = dataclasses.replace(main_codec, encrypt=True)
        ench = connect("127.0.0.1", ports["data_port_encrypted"], secret, enc_codec)
        raw = socket.create_connection(("127.0.0.1", ports["raw_port"]))
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            rounds = _Rounds(ch, raw, big, small, main_codec, ench)
            figures = rounds.run(repeats, warmup, rtt_rounds, zstd if compressed else None)
        finally:
            ch.close()
            ench.close()
            raw.close()
    finally:
        stop()

    tracr_mbps = _median(figures["tracr_MBps"])
    raw_mbps = _median(figures["raw_MBps"])
    tracr_rtt = _median(figures["tracr_rtt_ms"])
    raw_rtt = _median(figures["raw_rtt_ms"])
    enc_mbps = _median(figures["encrypted_MBps"])
    result: dict[str, Any] = {
        "throughput_ratio": tracr_mbps / raw_mbps,
        "rtt_ratio": tracr_rtt / raw_rtt,
        "tracr_MBps": tracr_mbps,
        "raw_MBps": raw_mbps,
        "tracr_rtt_ms": tracr_rtt,
        "raw_rtt_ms": raw_rtt,
        "size_mb": nbytes / 1e6,
        "repeats": repeats,
        "rtt_rounds": rtt_rounds,
        "warmup": warmup,
        "codec": main_codec.codec,
        "targets": dict(TARGETS),
        "spread": {
            "tracr_MBps_min_max": [min(figures["tracr_MBps"]), max(figures["tracr_MBps"])],
            "raw_MBps_min_max": [min(figures["raw_MBps"]), max(figures["raw_MBps"])],
            "tracr_rtt_ms_p10_p90": _deciles(figures["tracr_rtt_ms"]),
            "raw_rtt_ms_p10_p90": _deciles(figures["raw_rtt_ms"]),
        },
        "link": "loopback, peer "
        + ("on threads of this process" if in_process else "in a separate process"),
        "mac": "AES-256-GCM tag (GMAC) on every frame, per-direction session keys",
        "mac_MBps": tracr_mbps,  # the tracr figures above are the MAC'd path
        "encrypted": {
            "cipher": "AES-256-GCM",
            "MBps": enc_mbps,
            "throughput_ratio": enc_mbps / raw_mbps,
        },
        "crypto_GBps": _crypto_speed(big),
    }
    if compressed:
        result["zstd"] = {
            "level": zstd.level,
            "filter": zstd.filter,
            "MBps": _median(figures["zstd_MBps"]),
            "compression_ratio": nbytes / _median(figures["zstd_encoded"]),
            "encode_ms": _median(figures["zstd_encode_ms"]),
            "decode_ms": _median(figures["zstd_decode_ms"]),
            "round_trip_ms": _median(figures["zstd_ms"]),
        }
    ok = result["throughput_ratio"] >= 0.8 and result["rtt_ratio"] <= 1.5
    result["meets_targets"] = ok
    result["exit_code"] = 1 if (getattr(args, "strict", False) and not ok) else 0
    return result


def _crypto_speed(big) -> dict[str, float]:
    """GB/s of tagging and of encrypting the tensor's bytes in this process (no network)."""
    from experiment_design.transport import derive
    from experiment_design.transport.codec import byte_view, now_ms

    view = byte_view(big)
    out = bytearray(view.nbytes)
    session = derive(os.urandom(32), os.urandom(32), os.urandom(32), encrypt=True)[0]
    tag_ms, enc_ms = [], []
    for _ in range(5):
        t0 = now_ms()
        mac = session.payload_mac()
        mac.authenticate_additional_data(view)
        mac.finalize()
        t1 = now_ms()
        enc = session.payload_encryptor()
        enc.update_into(view, out)
        enc.finalize()
        t2 = now_ms()
        tag_ms.append(t1 - t0)
        enc_ms.append(t2 - t1)
    n = view.nbytes / 1e9
    return {"mac": n / (_median(tag_ms) / 1e3), "encrypt": n / (_median(enc_ms) / 1e3)}


class _Rounds:
    """One measured round of each kind; every figure is appended to ``self.out``."""

    def __init__(self, ch, raw, big, small, codec, ench=None) -> None:
        from experiment_design.transport.auth import recv_exact
        from experiment_design.transport.codec import byte_view, now_ms
        from experiment_design.transport.peer import RAW_REQUEST

        self.ch, self.raw, self.big, self.small, self.codec = ch, raw, big, small, codec
        self.ench = ench
        self.recv_exact, self.now_ms = recv_exact, now_ms
        self.nbytes = big.numel() * big.element_size()
        self.big_view = byte_view(big)
        self.small_bytes = bytes(byte_view(small))
        self.raw_head = RAW_REQUEST.pack(b"A", self.nbytes)
        self.echo_head = RAW_REQUEST.pack(b"E", len(self.small_bytes))
        self.out: dict[str, list[float]] = defaultdict(list)

    def tracr_big(self, codec=None) -> None:
        t0 = self.now_ms()
        sent = self.ch.send({"op": "ack"}, {"x": self.big}, codec=codec or self.codec)
        header, _, _ = self.ch.recv()
        ms = self.now_ms() - t0
        if header.get("op") != "ack":
            raise TracrError(f"the bench peer answered {header!r}")
        key = "zstd" if codec is not None else "tracr"
        self.out[f"{key}_MBps"].append(self.nbytes / 1e6 / (ms / 1e3))
        if codec is not None:
            self.out["zstd_ms"].append(ms)
            self.out["zstd_encoded"].append(sent.encoded_bytes)
            self.out["zstd_encode_ms"].append(sent.encode_ms)
            self.out["zstd_decode_ms"].append(float(header.get("decode_ms", float("nan"))))

    def encrypted_big(self) -> None:
        t0 = self.now_ms()
        self.ench.send({"op": "ack"}, {"x": self.big}, codec=self.codec)
        header, _, _ = self.ench.recv()
        ms = self.now_ms() - t0
        if header.get("op") != "ack":
            raise TracrError(f"the bench peer answered {header!r}")
        self.out["encrypted_MBps"].append(self.nbytes / 1e6 / (ms / 1e3))

    def raw_big(self) -> None:
        t0 = self.now_ms()
        self.raw.sendall(self.raw_head)
        self.raw.sendall(self.big_view)
        self.recv_exact(self.raw, 1)
        self.out["raw_MBps"].append(self.nbytes / 1e6 / ((self.now_ms() - t0) / 1e3))

    def tracr_small(self) -> None:
        t0 = self.now_ms()
        self.ch.request({"op": "echo"}, {"x": self.small})
        self.out["tracr_rtt_ms"].append(self.now_ms() - t0)

    def raw_small(self) -> None:
        t0 = self.now_ms()
        self.raw.sendall(self.echo_head + self.small_bytes)
        self.recv_exact(self.raw, len(self.small_bytes))
        self.out["raw_rtt_ms"].append(self.now_ms() - t0)

    def run(self, repeats: int, warmup: int, rtt_rounds: int, zstd) -> dict[str, list[float]]:
        """Warm up, then measure; ABBA order so neither side always goes first."""
        self._alternate(self.tracr_big, self.raw_big, warmup, repeats, self.encrypted_big)
        self._alternate(self.tracr_small, self.raw_small, max(warmup, 10), rtt_rounds)
        if zstd is not None:  # last, on its own: its CPU load must not disturb the comparison
            for i in range(warmup + repeats):
                if i == warmup:
                    for key in [k for k in self.out if k.startswith("zstd")]:
                        self.out[key].clear()
                self.tracr_big(zstd)
        return self.out

    def _alternate(self, a, b, warmup: int, rounds: int, c=None) -> None:
        steps = [a, b] if c is None else [a, b, c]
        for i in range(warmup + rounds):
            if i == warmup:
                for key in _KEYS[a.__name__]:
                    self.out[key].clear()
            k = i % len(steps)  # rotate, so no step always goes first
            for step in steps[k:] + steps[:k]:
                step()


_KEYS = {
    "tracr_big": ("tracr_MBps", "raw_MBps", "encrypted_MBps"),
    "tracr_small": ("tracr_rtt_ms", "raw_rtt_ms"),
}
