"""The data channel over real loopback sockets: auth, framing, limits, probe, big tensors."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
import torch

from experiment_design.errors import TracrError
from experiment_design.transport import (
    AuthError,
    ChannelClosed,
    CodecConfig,
    DataServer,
    Limits,
    ProtocolError,
    TransportError,
    connect,
)
from experiment_design.transport.frame import PREFIX, VERSION

SECRET = os.urandom(32)


class Peer:
    """A DataServer whose accepted channels run ``handler`` on a background thread."""

    def __init__(self, handler=None, *, codec=None, limits=None, handshake_timeout=5.0):
        self.server = DataServer(
            "127.0.0.1",
            0,
            SECRET,
            codec or CodecConfig(),
            limits=limits,
            handshake_timeout=handshake_timeout,
        )
        self.handler = handler or echo
        self.errors: list[BaseException] = []
        self.channels = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.address[1]

    def _serve(self) -> None:
        while True:
            try:
                ch = self.server.accept(timeout=10)
            except TransportError:
                return
            self.channels.append(ch)
            try:
                self.handler(ch)
            except TransportError as exc:
                self.errors.append(exc)

    def close(self) -> None:
        self.server.close()
        for ch in self.channels:
            ch.close()
        self.thread.join(timeout=5)


def echo(ch) -> None:
    while True:
        try:
            header, tensors, stats = ch.recv()
        except ChannelClosed:
            return
        ch.send({"op": "reply", "got": header, "raw": stats.raw_bytes}, tensors)


@pytest.fixture
def peer():
    p = Peer()
    yield p
    p.close()


@pytest.mark.parametrize("codec", ["none", "zstd", "lz4"])
def test_round_trip_of_several_tensors_and_header(peer, codec):
    cfg = CodecConfig(codec=codec, filter="bitshuffle" if codec == "lz4" else "shuffle")
    tensors = {
        "x": torch.relu(torch.randn(2, 64, 7, 7)),
        "skip": torch.randn(2, 8).bfloat16(),
        "mask": torch.rand(5) > 0.5,
        "ids": torch.arange(12).view(3, 4).t(),  # not contiguous
        "none": torch.empty(0),
    }
    with connect("127.0.0.1", peer.port, SECRET, cfg) as ch:
        header, back, stats = ch.request({"split": 4, "tags": ["a", None]}, tensors)
    assert header["got"] == {"split": 4, "tags": ["a", None]}
    assert (
        header["raw"]
        == stats.send.raw_bytes
        == sum(t.numel() * t.element_size() for t in tensors.values())
    )
    assert list(back) == list(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
    assert stats.rtt_ms > 0 and stats.send.encode_ms >= 0 and stats.recv.recv_ms >= 0
    if codec != "none":
        assert stats.send.encoded_bytes < stats.send.raw_bytes


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_a_20_mb_tensor_arrives_intact(peer, codec):
    t = torch.relu(torch.randn(5_000_000, generator=torch.Generator().manual_seed(3)))
    with connect("127.0.0.1", peer.port, SECRET, CodecConfig(codec=codec)) as ch:
        _, back, stats = ch.request({}, {"x": t}, codec=CodecConfig(codec=codec))
    assert torch.equal(back["x"], t)
    assert stats.send.raw_bytes == 20_000_000
    assert back["x"].untyped_storage().nbytes() == 20_000_000  # received in place, no extra copies


def test_wrong_secret_is_dropped_and_server_keeps_serving(peer):
    with pytest.raises(AuthError):
        connect("127.0.0.1", peer.port, os.urandom(32), CodecConfig())
    with connect("127.0.0.1", peer.port, SECRET, CodecConfig()) as ch:
        header, _, _ = ch.request({"op": "hello"})
    assert header["got"] == {"op": "hello"}
    assert peer.server.rejected == 1


def test_client_refuses_a_server_without_the_secret():
    impostor = DataServer("127.0.0.1", 0, os.urandom(32), CodecConfig())
    threading.Thread(target=lambda: _swallow(impostor.accept, 5), daemon=True).start()
    with pytest.raises(AuthError):
        connect("127.0.0.1", impostor.address[1], SECRET, CodecConfig())
    impostor.close()


def _swallow(fn, *args):
    try:
        fn(*args)
    except TransportError:
        pass


def test_garbage_and_silent_peers_are_dropped_and_a_good_client_gets_through():
    p = Peer(handshake_timeout=0.3)
    try:
        junk = socket.create_connection(("127.0.0.1", p.port))
        junk.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(200))
        silent = socket.create_connection(("127.0.0.1", p.port))  # never answers the challenge
        with connect("127.0.0.1", p.port, SECRET, CodecConfig()) as ch:
            header, _, _ = ch.request({"op": "after-junk"})
        assert header["got"]["op"] == "after-junk"
        # handshakes run side by side now: the silent one is dropped at its own deadline
        _eventually(lambda: p.server.rejected == 2)
        assert p.server.rejected == 2
        junk.close()
        silent.close()
    finally:
        p.close()


@pytest.mark.parametrize(
    "frame",
    [
        b"\x00" * PREFIX.size,  # bad magic
        PREFIX.pack(b"TRCF", 1, 0, 0, 2, 2, 0) + b"[]{}",  # an older frame version
        PREFIX.pack(b"TRCF", VERSION, 0, 0, 2, 1 << 30, 0),  # absurd header length
        PREFIX.pack(b"TRCF", VERSION, 0, 1, 2, 10, 1 << 40),  # absurd payload
        PREFIX.pack(b"TRCF", VERSION, 0, 0, 2, 9, 0) + b"[]not json!",
        PREFIX.pack(b"TRCF", VERSION, 0, 0, 2, 2, 0) + b"[][]",
        PREFIX.pack(b"TRCF", VERSION, 0, 0, 2, 2, 0) + b"{}{}",  # table is not a list
        PREFIX.pack(b"TRCF", VERSION, 0, 1, 2, 2, 16) + b"[]{}" + bytes(16),  # table vs prefix
    ],
    ids=[
        "magic",
        "version",
        "header-size",
        "payload-size",
        "not-json",
        "not-an-object",
        "table",
        "counts",
    ],
)
def test_garbage_frames_after_auth_close_the_channel(frame):
    got: list[BaseException] = []
    done = threading.Event()

    def handler(ch):
        try:
            ch.recv()
        except TransportError as exc:
            got.append(exc)
            raise
        finally:
            done.set()

    p = Peer(handler, limits=Limits(max_header_bytes=4096, max_message_bytes=1 << 24))
    try:
        ch = connect("127.0.0.1", p.port, SECRET, CodecConfig())
        ch.send_packed(*_split(frame))  # sealed: it reaches the parser
        assert done.wait(5)
        ch.close()
        p.close()
        assert len(got) == 1 and isinstance(got[0], ProtocolError)
        assert p.channels[0].closed
    finally:
        p.close()


def _eventually(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)


def _split(frame: bytes) -> tuple[bytes, list[bytes]]:
    """(prefix + table + header, payload) of a hand-made frame, as far as its prefix says."""
    _, _, _, _, tlen, hlen, _ = PREFIX.unpack_from(frame)
    cut = min(len(frame), PREFIX.size + tlen + hlen)
    return frame[:cut], [frame[cut:]] if frame[cut:] else []


def test_probe_is_answered_inside_recv_and_reports_positive_figures(peer):
    with connect("127.0.0.1", peer.port, SECRET, CodecConfig()) as ch:
        net = ch.probe(sizes=(4096, 65536), rounds=2)
        header, _, _ = ch.request({"op": "after-probe"})  # the peer's recv() is still in step
    assert net["rtt_ms"] > 0 and net["bandwidth_Bps"] > 0
    assert len(net["samples"]) == 2 + 2 * 2 and all(s["ms"] > 0 for s in net["samples"])
    assert header["got"] == {"op": "after-probe"}


def test_probe_reports_the_cpu_a_byte_costs_each_end(peer):
    """The receiver's CPU clock rides on its acknowledgements, so the prober learns what
    the bytes cost both ends (here both ends are this process: each figure holds both)."""
    with connect("127.0.0.1", peer.port, SECRET, CodecConfig()) as ch:
        net = ch.probe(sizes=(1 << 20,), rounds=3)
    assert net["send_ns_per_byte"] is not None and net["recv_ns_per_byte"] is not None
    assert 0.0 < net["send_ns_per_byte"] < 1000.0 and 0.0 < net["recv_ns_per_byte"] < 1000.0


def test_peer_close_is_reported_as_channel_closed():
    p = Peer(lambda ch: ch.close())
    try:
        ch = connect("127.0.0.1", p.port, SECRET, CodecConfig())
        with pytest.raises(ChannelClosed):
            ch.recv()
        assert ch.closed
    finally:
        p.close()


def test_short_secret_and_unreachable_port_are_clear_errors():
    with pytest.raises(AuthError):
        DataServer("127.0.0.1", 0, b"short", CodecConfig())
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(TransportError, match="cannot open"):
        connect("127.0.0.1", port, SECRET, CodecConfig(), timeout=0.3)


def test_both_ends_disable_nagle(peer):
    with connect("127.0.0.1", peer.port, SECRET, CodecConfig()) as ch:
        ch.request({})
        assert ch.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        assert peer.channels[0].sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_a_silent_partner_times_out_when_asked_to():
    p = Peer(lambda ch: None)  # accepts, then never sends
    try:
        ch = connect("127.0.0.1", p.port, SECRET, CodecConfig())
        ch.set_timeout(0.2)
        with pytest.raises(TransportError, match="timed out"):
            ch.recv()
        assert ch.closed
    finally:
        p.close()


def test_back_to_back_frames_and_a_large_header_stay_in_step(peer):
    big_note = "n" * 300_000  # header larger than the read-ahead buffer
    with connect("127.0.0.1", peer.port, SECRET, CodecConfig(codec="lz4")) as ch:
        for i in range(6):  # several frames in flight before the first reply is read
            ch.send({"i": i}, {"x": torch.full((i + 1, 3), float(i))})
        ch.send({"i": "big", "note": big_note}, {"y": torch.arange(5)})
        for i in range(6):
            header, back, _ = ch.recv()
            assert header["got"] == {"i": i}
            assert torch.equal(back["x"], torch.full((i + 1, 3), float(i)))
        header, back, _ = ch.recv()
    assert header["got"]["note"] == big_note and torch.equal(back["y"], torch.arange(5))


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_an_encrypted_channel_round_trips_small_and_large_frames(codec):
    cfg = CodecConfig(codec=codec, encrypt=True)
    p = Peer(codec=cfg)
    try:
        big = torch.relu(torch.randn(600_000, generator=torch.Generator().manual_seed(1)))
        with connect("127.0.0.1", p.port, SECRET, cfg) as ch:
            for t in (torch.arange(10), big, torch.ones(2, 3)):
                header, back, _ = ch.request({"n": t.numel()}, {"x": t, "y": t[:3] * 2})
                assert header["got"] == {"n": t.numel()}
                assert torch.equal(back["x"], t) and torch.equal(back["y"], t[:3] * 2)
    finally:
        p.close()


def test_both_ends_must_agree_on_encryption():
    p = Peer(codec=CodecConfig(encrypt=True))
    try:
        with pytest.raises(AuthError, match="encrypt"):
            connect("127.0.0.1", p.port, SECRET, CodecConfig(encrypt=False))
    finally:
        p.close()
    with pytest.raises(TracrError, match="encrypt"):
        CodecConfig(encrypt="yes")
    assert CodecConfig.from_dict({"encrypt": True}).encrypt is True
