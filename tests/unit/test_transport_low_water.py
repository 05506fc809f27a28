"""A large payload wakes its receiver once per low-water mark, not at every burst of bytes.

Real TCP on loopback, through a proxy thread that forwards the client's bytes in small
pieces with pauses between them (the way a shaped link delivers a frame). Before the
channel set ``SO_RCVLOWAT``, the thread reading a 1 MB frame slept and woke once per
piece (64 voluntary context switches here; on the lab's 32 MB/s link, 2.66 ms of CPU per MB
received instead of 0.46). The deadline keeps counting silence: a slow but steady sender
is not lost, a sender that stops is.
"""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
import torch

from experiment_design.transport import CodecConfig, DataServer, TransportError, connect

SECRET = os.urandom(32)
PIECE = 16 * 1024


def _switches() -> int:
    """Voluntary context switches of the calling thread so far (each one a sleep)."""
    with open(f"/proc/self/task/{threading.get_native_id()}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc")


class TrickleProxy:
    """Forwards client -> server in PIECE-byte writes ``gap_s`` apart (server -> client
    at once); after ``stall_after`` bytes upstream it stops forwarding (a link gone
    silent mid-frame)."""

    def __init__(self, port: int, gap_s: float, stall_after: int | None = None) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target, self.gap_s, self.stall_after = port, gap_s, stall_after
        self.trickle = False  # the handshake passes at once; frames after it trickle
        self.stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        client, _ = self.listener.accept()
        server = socket.create_connection(("127.0.0.1", self.target))
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()
        self._pipe(client, server, True)

    def _pipe(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        sent = 0
        while not self.stop.is_set():
            data = src.recv(PIECE)
            if not data:
                break
            if upstream and self.trickle:
                if self.stall_after is not None and sent >= self.stall_after:
                    self.stop.wait()  # silent from here on
                    return
                time.sleep(self.gap_s)
                sent += len(data)
            dst.sendall(data)
        dst.close()

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


def _serve_one(server: DataServer, timeout: float, out: dict) -> None:
    ch = server.accept(timeout=10)
    ch.set_timeout(timeout)
    try:
        before = _switches()
        header, tensors, _ = ch.recv()
        out["switches"] = _switches() - before
        out["tensors"] = tensors
        ch.send({"op": "ok"}, {})
    except TransportError as exc:
        out["error"] = exc
    finally:
        out["done"] = time.monotonic()


def _run(gap_s: float, timeout: float, stall_after: int | None = None) -> dict:
    server = DataServer("127.0.0.1", 0, SECRET, CodecConfig(codec="none"))
    proxy = TrickleProxy(server.address[1], gap_s, stall_after)
    out: dict = {}
    t = threading.Thread(target=_serve_one, args=(server, timeout, out), daemon=True)
    t.start()
    x = torch.randn(1 << 18)  # 1 MiB of payload, sent raw
    try:
        with connect("127.0.0.1", proxy.port, SECRET, CodecConfig(codec="none")) as ch:
            proxy.trickle = True
            out["start"] = time.monotonic()
            ch.send({"op": "big"}, {"x": x})
            t.join(timeout=30)
    finally:
        proxy.close()
        server.close()
    assert not t.is_alive()
    out["x"] = x
    return out


def test_a_large_frame_wakes_its_reader_a_few_times_not_once_per_piece():
    out = _run(gap_s=0.001, timeout=10.0)
    assert "error" not in out, out.get("error")
    assert torch.equal(out["tensors"]["x"], out["x"])
    # 64 pieces arrive one by one; with the mark the reader sleeps for the prefix, the
    # header and the payload, plus a few for the interpreter's lock
    assert out["switches"] <= 16, f"{out['switches']} sleeps for a 1 MiB frame in 64 pieces"


def test_a_slow_steady_sender_is_not_taken_for_a_silent_one():
    # 64 pieces 25 ms apart (1.6 s) under a 0.4 s deadline: the mark is never reached in
    # time, but bytes keep coming, so the frame arrives
    out = _run(gap_s=0.025, timeout=0.4)
    assert "error" not in out, out.get("error")
    assert torch.equal(out["tensors"]["x"], out["x"])


def test_a_sender_silent_mid_frame_times_out_within_twice_the_deadline():
    out = _run(gap_s=0.001, timeout=0.5, stall_after=256 * 1024)
    assert isinstance(out.get("error"), TransportError)
    assert "timed out" in str(out["error"])
    # the first bytes after the last read may restart the clock once
    assert out["done"] - out["start"] < 0.5 * 2 + 0.5



class _Recording:
    """A socket that records the flags of each ``sendall`` and passes everything on."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock, self.writes = sock, []

    def sendall(self, data, flags: int = 0) -> None:
        self.writes.append((memoryview(data).nbytes, flags))
        self._sock.sendall(data, flags)

    def __getattr__(self, name):
        return getattr(self._sock, name)


@pytest.mark.parametrize("encrypt", [False, True])
def test_a_large_frame_leaves_with_its_header_in_the_payloads_segments(encrypt):
    """Every write of a large frame but the last says more is coming (MSG_MORE), so the
    header is not a packet of its own. Sent alone (TCP_NODELAY), it was the one packet in
    flight when the payload followed, the kernel held the payload back for that packet's
    ACK (TSO deferral), and the receiver delayed the ACK: on the lab's 32 MB/s link, 100 KB
    frames sent one at a time stalled for 90-125 ms (14 times in 1200 frames, every 6th
    frame at times; none in 1200 frames after). The last write (the tag) pushes it all."""
    server = DataServer("127.0.0.1", 0, SECRET, CodecConfig(codec="none", encrypt=encrypt))
    out: dict = {}
    t = threading.Thread(target=_serve_one, args=(server, 10.0, out), daemon=True)
    t.start()
    x = torch.randn(3 << 18)  # 3 MiB of payload, sent raw: several pieces
    try:
        with connect("127.0.0.1", server.address[1], SECRET,
                     CodecConfig(codec="none", encrypt=encrypt)) as ch:
            ch.sock = rec = _Recording(ch.sock)
            ch.send({"op": "big"}, {"x": x})
            t.join(timeout=30)
    finally:
        server.close()
    assert "error" not in out, out.get("error")
    assert torch.equal(out["tensors"]["x"], x)
    assert len(rec.writes) >= 4  # the header, pieces of the payload, the tag
    assert all(flags & socket.MSG_MORE for _, flags in rec.writes[:-1]), rec.writes
    assert not rec.writes[-1][1] & socket.MSG_MORE, rec.writes
