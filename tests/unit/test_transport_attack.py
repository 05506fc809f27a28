"""The data path under attack, over real loopback sockets: a slowloris client, a
man-in-the-middle relay that passes the handshake through and then rewrites bytes, and
a peer that declares a huge tensor it never sends."""

from __future__ import annotations

import os
import socket
import threading
import time
import tracemalloc

import pytest
import torch

from experiment_design.transport import (
    AuthError,
    ChannelClosed,
    CodecConfig,
    DataChannel,
    DataServer,
    IntegrityError,
    ProtocolError,
    TransportError,
    connect,
    derive,
)
from experiment_design.transport.auth import DIGEST, REPLY_HEAD
from experiment_design.transport.codec import EncodedTensor
from experiment_design.transport.frame import PREFIX, VERSION, pack_head

SECRET = os.urandom(32)
RAW = CodecConfig(codec="none", level=0, filter="none")
REPLY = REPLY_HEAD + len("client") + DIGEST  # what connect() says before its first frame


class Receiver:
    """A DataServer whose first channel's first message (or error) is kept."""

    def __init__(self, codec=RAW, **kw):
        self.server = DataServer("127.0.0.1", 0, SECRET, codec, **kw)
        self.got: list = []
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server.address[1]

    def _serve(self) -> None:
        try:
            ch = self.server.accept(timeout=20)
        except TransportError:
            return
        try:
            self.got.append(ch.recv())
        except Exception as exc:  # noqa: BLE001 - the test looks at what came out
            self.got.append(exc)
        finally:
            self.done.set()

    def close(self) -> None:
        self.server.close()


class Relay:
    """A man in the middle: forwards both ways, and in the client-to-server stream
    replaces the first ``pattern`` with ``replacement`` (or flips the byte at ``offset``)."""

    def __init__(self, target_port: int, *, pattern=b"", replacement=b"", offset=None):
        self.target = target_port
        self.pattern, self.replacement, self.offset = pattern, replacement, offset
        self.seen = bytearray()  # everything the client sent, as it went on the wire
        self.tampered = False
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        server = socket.create_connection(("127.0.0.1", self.target))
        threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()
        self._pump(client, server, True)

    def _pump(self, src, dst, tamper: bool) -> None:
        # Nothing is held back (the handshake must pass at its own pace): a pattern is
        # looked for within each read, and each frame the tests send leaves in one write.
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if tamper and not self.tampered:
                    start = len(self.seen)
                    self.seen += data
                    if self.offset is not None and start <= self.offset < start + len(data):
                        i = self.offset - start
                        data = data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]
                        self.tampered = True
                    elif self.pattern and self.pattern in data:
                        data = data.replace(self.pattern, self.replacement, 1)
                        self.tampered = True
                elif tamper:
                    self.seen += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def _through_relay(relay_kw: dict, header: dict, tensors: dict, codec=RAW):
    rx = Receiver(codec)
    relay = Relay(rx.port, **relay_kw)
    try:
        with connect("127.0.0.1", relay.port, SECRET, codec) as ch:  # the handshake passes
            try:
                ch.send(header, tensors)
            except TransportError:
                pass  # the receiver may refuse a rewritten header before the payload is out
            assert rx.done.wait(10)
        return rx.got[0], relay
    finally:
        relay.close()
        rx.close()


@pytest.mark.parametrize("size", [4096, 1 << 20], ids=["small-frame", "large-frame"])
def test_a_payload_rewritten_on_the_path_is_rejected_and_named(size):
    x = torch.full((size,), 7, dtype=torch.uint8)
    pattern = b"\x07" * 64
    got, relay = _through_relay(
        {"pattern": pattern, "replacement": pattern[:-1] + b"\x06"}, {"split": 4}, {"x": x}
    )
    assert relay.tampered
    assert isinstance(got, IntegrityError), got  # not a silently altered tensor
    assert "integrity" in str(got) and "127.0.0.1:" in str(got)


@pytest.mark.parametrize("size", [16, 1 << 20], ids=["small-frame", "large-frame"])
def test_a_header_rewritten_on_the_path_is_rejected_and_named(size):
    x = torch.zeros(size, dtype=torch.uint8)
    got, relay = _through_relay(
        {"pattern": b'"split":4', "replacement": b'"split":5'}, {"split": 4}, {"x": x}
    )
    assert relay.tampered
    assert isinstance(got, IntegrityError), got  # not split 5
    assert "integrity" in str(got) and "127.0.0.1:" in str(got)


def test_an_encrypted_channel_hides_the_header_and_rejects_a_flipped_bit():
    enc = CodecConfig(codec="none", level=0, filter="none", encrypt=True)
    header = {"split": 4, "note": "secret-note"}
    x = torch.full((4096,), 7, dtype=torch.uint8)
    got, relay = _through_relay({"offset": 10**9}, header, {"x": x}, enc)  # no tampering
    assert got[0] == header and torch.equal(got[1]["x"], x)
    assert b"secret-note" not in relay.seen and b"\x07" * 64 not in relay.seen
    got, relay = _through_relay({"offset": REPLY + PREFIX.size + 3}, header, {"x": x}, enc)
    assert relay.tampered and isinstance(got, IntegrityError), got


def test_replayed_or_reordered_frames_fail_their_tag():
    a, b = socket.socketpair()
    client, server = derive(SECRET, bytes(32), bytes(32), encrypt=False)
    left, right = DataChannel(a, RAW, session=client), DataChannel(b, RAW, session=server)
    try:
        head = pack_head({"i": 0}, ())
        first = client.seal_head(head, PREFIX.size)
        client.end_frame()
        second = client.seal_head(pack_head({"i": 1}, ()), PREFIX.size)
        client.end_frame()
        a.sendall(second + first)  # reordered
        with pytest.raises(IntegrityError, match="integrity"):
            right.recv()
        assert right.closed
    finally:
        left.close()
        right.close()


def test_a_slowloris_client_does_not_keep_a_partner_out():
    rx = Receiver()  # default handshake deadline (5 s)
    stop = threading.Event()

    def trickle() -> None:
        s = socket.create_connection(("127.0.0.1", rx.port))
        try:
            while not stop.is_set():
                s.sendall(b"x")
                stop.wait(2)
        except OSError:
            pass
        finally:
            s.close()

    threading.Thread(target=trickle, daemon=True).start()
    time.sleep(0.3)  # the slow client is first in line
    try:
        t0 = time.monotonic()
        with connect("127.0.0.1", rx.port, SECRET, RAW, timeout=10) as ch:
            ch.send({"op": "hello"})
            assert rx.done.wait(10)
        assert rx.got[0][0] == {"op": "hello"}
        assert time.monotonic() - t0 < 10  # the edge's normal connect deadline
    finally:
        stop.set()
        rx.close()


def test_a_trickling_handshake_is_dropped_at_its_whole_deadline():
    rx = Receiver(handshake_timeout=1.0)
    s = socket.create_connection(("127.0.0.1", rx.port))
    try:
        deadline = time.monotonic() + 8
        while rx.server.rejected == 0 and time.monotonic() < deadline:
            try:
                s.sendall(b"x")  # one byte every 0.3 s: never a 1 s silence
            except OSError:
                break
            time.sleep(0.3)
        assert rx.server.rejected == 1
    finally:
        s.close()
        rx.close()


def test_excess_unauthenticated_connections_are_closed_at_once():
    rx = Receiver(max_pending=4)
    flood = [socket.create_connection(("127.0.0.1", rx.port)) for _ in range(12)]
    try:
        deadline = time.monotonic() + 5
        while rx.server.rejected < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert rx.server.pending <= 4 and rx.server.rejected >= 8
    finally:
        for s in flood:
            s.close()
        rx.close()


def test_a_declared_huge_tensor_is_not_allocated_before_it_arrives():
    a, b = socket.socketpair()
    client, server = derive(SECRET, bytes(32), bytes(32), encrypt=False)
    right = DataChannel(b, RAW, session=server)
    n = 1 << 31  # 2 GiB declared, the largest a frame may carry by default
    head = pack_head({"op": "big"}, [EncodedTensor("x", "uint8", (n,), n, "none", [n], [])])
    outcome: list = []
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        t = threading.Thread(target=lambda: outcome.append(_catch(right.recv)), daemon=True)
        t.start()
        a.sendall(client.seal_head(head, PREFIX.size) + bytes(1 << 20))  # then nothing more
        time.sleep(1.0)
        peak = tracemalloc.get_traced_memory()[1] - base
        a.close()
        t.join(10)
    finally:
        tracemalloc.stop()
        right.close()
    assert peak < 256 << 20, f"{peak / 2**20:.0f} MiB set aside for 1 MiB received"
    assert isinstance(outcome[0], ChannelClosed)


def _catch(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        return exc


def _lossy_frame(entry: dict, payload: bytes) -> bytes:
    import json

    table, header = json.dumps([entry]).encode(), b"{}"
    return PREFIX.pack(b"TRCF", VERSION, 0, 1, len(table), len(header), len(payload)) + table + header


@pytest.mark.parametrize(
    "lossy, shape, payload",
    [
        ({"method": "int8", "channels": 3}, [4, 3], 27),  # per channel of a 2-D tensor
        # a nan scale leading the values (scales and zero points ride in the payload)
        ({"method": "int8"}, [4, 3], b"\x00\x00\xc0\x7f\x00" + bytes(12)),
        ({"method": "jpeg", "quality": 10**9, "scale": [1.0] * 3, "offset": [0.0] * 3,
          "sizes": [64]}, [1, 3, 8, 8], 64),
        # a well-formed entry whose "images" are 300 kB of zeros (a large frame)
        ({"method": "webp", "quality": 90, "scale": [1.0] * 3, "offset": [0.0] * 3,
          "sizes": [300_000]}, [1, 3, 256, 256], 300_000),
    ],
    ids=["channels-of-a-matrix", "nan-scale", "huge-quality", "garbage-images"],
)
def test_a_hostile_lossy_entry_is_refused_and_the_channel_closed(lossy, shape, payload):
    data = payload if isinstance(payload, bytes) else bytes(payload)
    payload = len(data)
    a, b = socket.socketpair()
    client, server = derive(SECRET, bytes(32), bytes(32), encrypt=False)
    left, right = DataChannel(a, RAW, session=client), DataChannel(b, RAW, session=server)
    raw = 4
    for d in shape:
        raw *= d
    entry = {"name": "x", "dtype": "float32", "shape": shape, "raw_nbytes": raw,
             "encoded_nbytes": payload, "codec": "none", "chunks": [payload], "lossy": lossy}
    sender = threading.Thread(
        target=lambda: _catch(lambda: left.send_packed(_lossy_frame(entry, data), [data])),
        daemon=True,
    )
    sender.start()
    try:
        with pytest.raises(ProtocolError):
            right.recv()
        assert right.closed
    finally:
        left.close()
        right.close()
        sender.join(10)


def _channel_pair(encrypt=False):
    a, b = socket.socketpair()
    client, server = derive(SECRET, bytes(32), bytes(32), encrypt=encrypt)
    return DataChannel(a, RAW, session=client), DataChannel(b, RAW, session=server)


@pytest.mark.parametrize(
    "header",
    [
        b'{"op":"result","id":"x"}',  # killed the head's receiver thread
        b'{"op":"result","id":1.5}',
        b'{"op":"result","id":true}',
        b'{"op":"result","id":1,"cpu_ms":NaN}',  # JSON's NaN literal
        b'{"op":"result","id":1,"decode_ms":-Infinity}',
        b'{"op":"infer","id":1,"hop":-1}',
        b'{"op":"infer","id":1,"route":["a",2],"cuts":[3]}',
        b'{"op":"infer","id":1,"cuts":[3.0]}',
        b'{"op":"result","id":99999999999999999999}',
        b'{"op":"result","id":1,"stages":[{"hop":"1"}]}',
        b'{"op":["x"]}',
        b'{"op":"solo","count":0}',
    ],
)
def test_a_header_field_of_the_wrong_type_closes_the_channel(header):
    left, right = _channel_pair()
    frame = PREFIX.pack(b"TRCF", VERSION, 0, 0, 2, len(header), 0) + b"[]" + header
    try:
        left.send_packed(frame)
        with pytest.raises(ProtocolError, match="header"):
            right.recv()
        assert right.closed
    finally:
        left.close()
        right.close()


def test_a_send_on_a_channel_a_bad_frame_closed_names_that_frame():
    """Regression: the throughput loop's receiver closed the channel on a reply with a bad
    id while its sender was writing; the sender's write then failed with "[Errno 9] Bad
    file descriptor", and when it reported first the run's error named that, not the bad
    reply (make test, once in 1,344). A send on a channel its receive closed now says what
    closed it. Before: "the data channel is closed", with no cause."""
    left, right = _channel_pair()
    header = b'{"op":"result","id":"x"}'
    try:
        left.send_packed(PREFIX.pack(b"TRCF", VERSION, 0, 0, 2, len(header), 0) + b"[]" + header)
        with pytest.raises(ProtocolError, match="header"):
            right.recv()
        with pytest.raises(TransportError, match="was closed: .*header.*id"):
            right.send({"op": "result", "id": 1})
    finally:
        left.close()
        right.close()


def test_a_reply_with_a_bad_id_ends_a_throughput_run_with_a_message():
    """The head's receiver read int(header["id"]): a reply whose id is not an integer
    killed that thread and the throughput loop then waited for replies until cancelled."""
    from experiment_design.errors import TracrError
    from experiment_design.runtime.chain import ChainHead, Route
    from experiment_design.split import build_split_model

    sm = build_split_model("alexnet")
    head, cloud = _channel_pair()

    class Owner:
        instance = "edge"
        split_model = sm
        downstream = {"cloud": head}
        cancel_event = threading.Event()
        stop_event = threading.Event()

    def answer() -> None:  # a cloud that replies to every inference with a string id
        try:
            while True:
                cloud.recv()
                cloud.send({"op": "result", "id": "x", "head": "edge", "stages": []})
        except TransportError:
            pass

    threading.Thread(target=answer, daemon=True).start()
    route = Route(("edge", "cloud"), (sm.valid_splits()[2],))
    x = torch.zeros(1, 3, 224, 224)
    outcome: list = []
    run = threading.Thread(
        target=lambda: outcome.append(
            _catch(lambda: ChainHead(Owner()).pipelined(route, [(x, 0, "i")], 8, 2, 0,
                                                        lambda c: None))),
        daemon=True,
    )
    run.start()
    run.join(30)
    try:
        assert not run.is_alive(), "the throughput loop still waits for replies"
        assert isinstance(outcome[0], TracrError) and "id" in str(outcome[0]), outcome
    finally:
        Owner.cancel_event.set()
        head.close()
        cloud.close()
        run.join(5)


def _peak_while_receiving(frame: bytes, payload: bytes) -> tuple[int, object]:
    """Peak traced memory (bytes) while a channel receives one hand-made frame, and
    what recv() gave (an exception here)."""
    left, right = _channel_pair()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        sender = threading.Thread(
            target=lambda: _catch(lambda: left.send_packed(frame, [payload])), daemon=True)
        sender.start()
        got = _catch(right.recv)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
        left.close()
        right.close()
        sender.join(10)
    return peak, got


@pytest.mark.parametrize(
    "dtype, shape, lossy, nchunks",
    [
        ("uint8", [1 << 30], None, 4),  # 1 GiB declared in four 256 MiB chunks
        ("float32", [1 << 28], {"method": "int8"}, 2),  # 1 GiB restored from 256 MiB
        ("float32", [1 << 27], {"method": "float16"}, 1),
    ],
    ids=["compressed", "int8-compressed", "float16-compressed"],
)
def test_a_small_frame_declaring_a_huge_size_is_refused_before_any_allocation(
    dtype, shape, lossy, nchunks
):
    """A 256-byte frame declaring 1 GiB cost 1 GiB of memory and 3.3 s before its chunk
    headers were read and found to be garbage."""
    import json

    raw = 4 if dtype == "float32" else 1
    for d in shape:
        raw *= d
    chunk = b"\x02\x01\x13\x08" + bytes(28)  # looks like a blosc2 header, declares nothing
    chunks = [len(chunk)] * nchunks
    entry = {"name": "x", "dtype": dtype, "shape": shape, "raw_nbytes": raw,
             "encoded_nbytes": sum(chunks), "codec": "zstd", "chunks": chunks}
    if lossy:
        entry["lossy"] = lossy
    payload = chunk * nchunks
    table, header = json.dumps(entry and [entry]).encode(), b"{}"
    frame = (PREFIX.pack(b"TRCF", VERSION, 0, nchunks, len(table), len(header), len(payload))
             + table + header)
    assert len(frame) + len(payload) < 512
    peak, got = _peak_while_receiving(frame, payload)
    assert isinstance(got, ProtocolError), got
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB set aside for a {len(frame)}-byte frame"


def test_a_frame_is_bounded_by_what_the_run_can_produce():
    """A valid blosc2 chunk of 256 MiB of zeros is a few kB on the wire: a channel whose
    limits come from the run's largest tensor refuses it before decompressing."""
    from experiment_design.transport.codec import encode_tensor
    from experiment_design.transport.frame import Limits, run_limits

    limits = run_limits(600_000)  # AlexNet's largest crossing, about
    assert limits.max_message_bytes < 64 << 20
    bomb = encode_tensor("x", torch.zeros(1 << 28, dtype=torch.uint8),
                         CodecConfig(codec="zstd", level=1))
    assert bomb.encoded_nbytes < 1 << 20
    a, b = socket.socketpair()
    client, server = derive(SECRET, bytes(32), bytes(32), encrypt=False)
    left = DataChannel(a, RAW, session=client)
    right = DataChannel(b, RAW, limits, session=server)
    frame = pack_head({"op": "infer"}, [bomb])
    sender = threading.Thread(target=lambda: _catch(lambda: left.send_packed(frame, bomb.buffers)),
                              daemon=True)
    sender.start()
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match="decodes to more than"):
            right.recv()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        left.close()
        right.close()
        sender.join(10)
    assert peak < 16 << 20
    assert Limits().max_message_bytes == 1 << 31  # a channel without a run keeps the default


class SilentCrowd:
    """``n`` connections that open and never say a word, kept running: any the server
    closes is opened again at once (an attacker's loop)."""

    def __init__(self, port: int, n: int = 48, source: str = "127.0.0.1",
                 reopen: bool = True) -> None:
        self.port, self.source, self.reopen = port, source, reopen
        self.socks = [self._open() for _ in range(n)]
        self.reopened = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._keep, daemon=True)
        self.thread.start()

    def _open(self) -> socket.socket | None:
        s = socket.socket()
        try:
            s.settimeout(1)
            s.bind((self.source, 0))
            s.connect(("127.0.0.1", self.port))
            return s
        except OSError:  # refused: the server stopped listening
            s.close()
            return None

    def _keep(self) -> None:
        import select

        while not self.stop.is_set():
            live = [s for s in self.socks if s is not None]
            ready = select.select(live, [], [], 0.05)[0] if live else []
            for s in ready:
                try:
                    closed = s.recv(4096, socket.MSG_DONTWAIT) == b""
                except BlockingIOError:
                    closed = False
                except OSError:
                    closed = True
                if closed:  # dropped by the server: straight back in
                    s.close()
                    self.socks[self.socks.index(s)] = self._open() if self.reopen else None
                    self.reopened += 1
            if not live and self.reopen:
                self.stop.wait(0.05)
                self.socks = [self._open() for _ in self.socks]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for s in self.socks:
            if s is not None:
                s.close()


class CountingConnects:
    """Counts the TCP connections this thread's connect() opens (its tries)."""

    def __init__(self, monkeypatch) -> None:
        self.tries = 0
        me = threading.get_ident()
        real = socket.create_connection

        def counted(*args, **kw):
            if threading.get_ident() == me:
                self.tries += 1
            return real(*args, **kw)

        monkeypatch.setattr(socket, "create_connection", counted)


def test_48_silent_connections_do_not_keep_a_partner_out(monkeypatch):
    """48 connections that open and never answer kept a partner out: 16 of them held
    every pending handshake slot for 5 s each, and the partner's connections were
    dropped and retried (a connect() with a 10 s deadline failed at it)."""
    rx = Receiver()
    crowd = SilentCrowd(rx.port, 48)
    count = CountingConnects(monkeypatch)
    try:
        time.sleep(0.5)  # the crowd is in first
        with connect("127.0.0.1", rx.port, SECRET, RAW, timeout=10) as ch:
            ch.send({"op": "hello"})
            assert rx.done.wait(10)
        assert rx.got[0][0] == {"op": "hello"}
        assert count.tries == 1, f"the partner needed {count.tries} connections"
    finally:
        crowd.close()
        rx.close()


def _until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)


def _admitting(*partners, **kw):
    """A DataServer named "cloud" that admits ``partners`` (name, hosts) only."""
    from experiment_design.transport import Partner, link_key

    server = DataServer("127.0.0.1", 0, None, RAW, name="cloud", **kw)
    server.admit([Partner(n, link_key(SECRET, "cloud", n), hosts) for n, hosts in partners])
    return server


def _connect_as(name, port, partner="cloud", secret=SECRET, **kw):
    from experiment_design.transport import link_key

    return connect("127.0.0.1", port, None, RAW, name=name, partner=partner,
                   key=link_key(secret, partner, name), **kw)


def test_48_silent_connections_from_another_address_are_refused_and_the_port_closes(
    monkeypatch,
):
    """Only the wired partners' addresses get a handshake; once every partner has
    connected the server stops listening."""
    server = _admitting(("edge", ("127.0.0.1",)))
    crowd = SilentCrowd(server.address[1], 48, source="127.0.0.2")  # another local user
    count = CountingConnects(monkeypatch)
    try:
        _until(lambda: server.rejected >= 48)
        assert server.pending == 0 and server.rejected >= 48  # none got a handshake
        with _connect_as("edge", server.address[1]) as ch:
            got = server.accept(timeout=5)
            ch.send({"op": "hello"})
            assert got.recv()[0] == {"op": "hello"} and got.partner == "edge"
            got.close()
        assert count.tries == 1
        assert server.complete
        with pytest.raises(OSError):  # the port is closed for the rest of the run
            socket.create_connection(("127.0.0.1", server.address[1]), timeout=1).close()
        with pytest.raises(TransportError, match="every admitted partner"):
            server.accept(timeout=1)
    finally:
        crowd.close()
        server.close()


@pytest.mark.parametrize("cap, reopen", [(None, True), (16, False)],
                         ids=["default-cap-crowd-reopening", "crowd-beyond-the-cap"])
def test_a_silent_crowd_from_the_partners_own_address_does_not_keep_it_out(
    monkeypatch, cap, reopen
):
    """On one host (loopback) the crowd shares the partner's address: handshakes cost a
    descriptor each, not a thread, so 48 fit under the per-source cap; beyond the cap a
    newcomer displaces the oldest silent one. Either way the partner gets in on its
    first try."""
    kw = {} if cap is None else {"max_pending_per_source": cap}
    server = _admitting(("edge", ("127.0.0.1",)), **kw)
    crowd = SilentCrowd(server.address[1], 48, reopen=reopen)
    count = CountingConnects(monkeypatch)
    try:
        _until(lambda: server.pending == (48 if cap is None else cap))
        assert server.pending == (48 if cap is None else cap)
        with _connect_as("edge", server.address[1], timeout=10):
            server.accept(timeout=5).close()
        assert count.tries == 1
    finally:
        crowd.close()
        server.close()


def test_a_link_redirected_to_another_stage_of_the_run_is_refused():
    """Each link has a key of its own and both ends say their names: a connection meant
    for 'mid' that the path delivers to 'cloud' fails (before, one secret for every link
    let it through)."""
    from experiment_design.transport import Partner, link_key

    cloud = DataServer("127.0.0.1", 0, None, RAW, name="cloud")
    cloud.admit([Partner("edge", link_key(SECRET, "cloud", "edge")),
                 Partner("mid", link_key(SECRET, "cloud", "mid"))])
    relay = Relay(cloud.address[1])  # edge thinks it talks to mid
    try:
        with pytest.raises(AuthError, match="not of 'mid'"):
            connect("127.0.0.1", relay.port, None, RAW, name="edge", partner="mid",
                    key=link_key(SECRET, "mid", "edge"), timeout=3)
    finally:
        relay.close()
        cloud.close()


def test_a_participant_cannot_pose_as_another():
    """'mid' holds only its own links' keys: claiming to be 'edge' at the cloud fails,
    whichever of its keys it proves."""
    from experiment_design.transport import link_key

    server = _admitting(("edge", ()), ("mid", ()))
    mids = [link_key(SECRET, "cloud", "mid"), link_key(SECRET, "edge", "mid")]
    try:
        for key in mids:
            with pytest.raises(AuthError):
                connect("127.0.0.1", server.address[1], None, RAW, name="edge",
                        partner="cloud", key=key, timeout=3)
        assert server.rejected == 2
        with _connect_as("mid", server.address[1]):  # as itself it gets in
            server.accept(timeout=5).close()
    finally:
        server.close()


def test_link_keys_differ_per_link_and_direction():
    from experiment_design.transport import link_key

    keys = {link_key(SECRET, s, c) for s, c in
            [("cloud", "edge"), ("edge", "cloud"), ("cloud", "mid"), ("mid", "edge"),
             ("clou", "dedge")]}
    assert len(keys) == 5
    assert link_key(SECRET, "cloud", "edge") != link_key(os.urandom(32), "cloud", "edge")


def test_an_unexpected_name_or_address_is_refused_and_a_name_is_taken_once():
    server = _admitting(("edge", ("127.0.0.1",)), ("mid", ("127.0.0.3",)))
    try:
        with pytest.raises(AuthError):
            _connect_as("intruder", server.address[1], timeout=3)
        with pytest.raises(AuthError):  # mid's key, from edge's address
            _connect_as("mid", server.address[1], timeout=3)
        with _connect_as("edge", server.address[1]):
            server.accept(timeout=5).close()
            with pytest.raises(TransportError):
                _connect_as("edge", server.address[1], timeout=3)
        assert not server.complete  # mid has not connected: still listening
    finally:
        server.close()
