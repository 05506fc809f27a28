"""A fuzzer of the data path: generated frames (prefixes, tensor tables, headers and
payloads, sealed with the session's keys, as an authenticated but confused or hostile
peer would send them) thrown at the receiving parser, and generated handshakes thrown at
a DataServer (as anyone who reaches its port could) and at the client (as a server, or
someone on the path, could). Every case ends in a TransportError or a valid result (a
frame whose known header fields check out, an authenticated channel) and leaves no
thread blocked. 500 cases each by default, 10,000 in the long mode (``-m long`` or
``TRACR_LONG=1``)."""

from __future__ import annotations

import hmac
import json
import os
import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from experiment_design.constants import LOSSY
from experiment_design.transport import (
    CodecConfig,
    DataChannel,
    DataServer,
    TransportError,
    auth,
    derive,
    link_key,
)
from experiment_design.transport.codec import CODECS, DTYPES
from experiment_design.transport.frame import MAGIC, PREFIX, VERSION
from experiment_design.transport.header import FIELDS, check_header

RAW = CodecConfig(codec="none", level=0, filter="none")

big_ints = st.one_of(
    st.integers(-3, 64), st.integers(-(2**70), 2**70), st.sampled_from([2**31, 2**63, 2**64])
)
scalars = st.one_of(
    st.none(), st.booleans(), big_ints, st.floats(allow_nan=False), st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


numbers = st.one_of(big_ints, st.floats(), st.sampled_from([0.0, 0.5, -1.0]))
lossy_objects = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"method": st.sampled_from([*LOSSY, "int3", 5])},
        optional={
            "scale": st.lists(numbers, max_size=4),
            "channels": big_ints | json_values,
            "offset": st.lists(numbers, max_size=4),
            "sizes": st.lists(big_ints, max_size=3),
            "quality": big_ints,
            "wanted": st.sampled_from([*LOSSY, "x"]),
            "why": st.sampled_from(["non-finite", "no gain", "x"]),
        },
    ),
)


@st.composite
def entries(draw):
    """A tensor entry: mostly plausible (sizes that add up), sometimes anything at all."""
    if draw(st.integers(0, 4)) == 0:
        return draw(json_values)
    dtype = draw(st.sampled_from([*DTYPES, "float128", 3, None]))
    shape = draw(st.lists(big_ints, max_size=5) | json_values)
    raw = 0
    if isinstance(shape, list) and all(type(d) is int for d in shape) and dtype in DTYPES:
        raw = DTYPES[dtype][1]
        for d in shape:
            raw *= d
    raw = draw(st.sampled_from([raw, raw, 0, -1, 2**40]) | big_ints)
    codec = draw(st.sampled_from([*CODECS, "pickle", ["none"], 0]))
    chunks = draw(st.sampled_from([[raw], [], [raw, 0]]) | st.lists(big_ints, max_size=3) | json_values)
    enc = sum(chunks) if isinstance(chunks, list) and all(type(c) is int for c in chunks) else raw
    entry = {"name": draw(st.text(max_size=4) | json_values), "dtype": dtype, "shape": shape,
             "raw_nbytes": raw, "encoded_nbytes": enc, "codec": codec, "chunks": chunks}
    if draw(st.integers(0, 2)) == 0:  # a reduced tensor's description, plausible or not
        entry["lossy"] = draw(lossy_objects)
    for key in draw(st.lists(st.sampled_from(sorted(entry)), max_size=2)):
        entry.pop(key, None)
    return entry


def _text(draw, value_strategy) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.binary(max_size=64))
    if kind == 1:  # deep nesting
        depth = draw(st.integers(1, 50_000))
        opener = draw(st.sampled_from(["[", '{"a":']))
        return (opener * depth).encode()
    return json.dumps(draw(value_strategy)).encode()


# values that a known header field may or may not accept (its type, its range, neighbours)
field_values = st.one_of(
    json_values, big_ints, st.text(max_size=300), st.booleans(),
    st.lists(st.one_of(big_ints, st.text(max_size=8)), max_size=5),
    st.lists(st.lists(st.one_of(big_ints, st.floats(allow_nan=False)), max_size=3), max_size=4),
    st.lists(st.dictionaries(st.sampled_from(["hop", "instance", "a", "b", "layers", "x"]),
                             json_values, max_size=4), max_size=3),
)


@st.composite
def headers(draw):
    """A caller header: tracr's own fields (of any type) beside the caller's, and now and
    then JSON's NaN/Infinity literals, which json.dumps writes and the parser refuses."""
    h = draw(st.dictionaries(st.sampled_from(sorted(FIELDS)), field_values, max_size=6))
    h.update(draw(st.dictionaries(st.text(max_size=6), json_values, max_size=3)))
    if draw(st.integers(0, 9)) == 0:
        h[draw(st.sampled_from(["cpu_ms", "x"]))] = draw(st.sampled_from(
            [float("nan"), float("inf"), -float("inf")]))
    return h


@st.composite
def frames(draw):
    table = _text(draw, st.lists(entries(), max_size=3))
    header = _text(draw, headers() | json_values)
    payload = draw(st.binary(max_size=2048))
    honest = draw(st.integers(0, 5)) > 0  # mostly: lengths that match what is sent
    nbuf = draw(st.integers(0, 3) | st.integers(0, 2**16 - 1))
    magic = MAGIC if draw(st.integers(0, 9)) else draw(st.binary(min_size=4, max_size=4))
    version = VERSION if draw(st.integers(0, 9)) else draw(st.integers(0, 255))
    if honest:
        tlen, hlen, plen = len(table), len(header), len(payload)
    else:
        tlen, hlen = draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 2**32 - 1))
        plen = draw(st.integers(0, 2**64 - 1))
    prefix = PREFIX.pack(magic, version, draw(st.integers(0, 255)), nbuf, tlen, hlen, plen)
    return prefix + table + header, payload


_ENTRY = {"name": "x", "dtype": "float32", "shape": [2], "raw_nbytes": 8,
          "encoded_nbytes": 8, "codec": "none", "chunks": [8]}


def _frame(table: list) -> tuple[bytes, bytes]:
    text, header = json.dumps(table).encode(), b"{}"
    payload = bytes(sum(e["encoded_nbytes"] for e in table))
    return PREFIX.pack(MAGIC, VERSION, 0, len(table), len(text), len(header),
                       len(payload)) + text + header, payload


LONG = bool(os.environ.get("TRACR_LONG"))
#: cases per fuzzer: the default suite, and the long mode
CASES, LONG_CASES = 500, 10_000
_SETTINGS = dict(deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _cases(long: bool):
    return settings(max_examples=LONG_CASES if long else CASES, **_SETTINGS)


def _no_thread_left(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(10)
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"threads left blocked: {stuck}"


def _throw_frame(frame) -> None:
    head, payload = frame
    a, b = socket.socketpair()
    client, server = derive(bytes(range(32)), bytes(32), bytes(32), encrypt=False)
    left, right = DataChannel(a, RAW, session=client), DataChannel(b, RAW, session=server)

    def send() -> None:
        try:
            left.send_packed(head, [payload] if payload else [])
        except TransportError:
            pass  # the receiver hung up first
        finally:
            left.close()  # a frame promising more than it carries ends at EOF

    sender = threading.Thread(target=send, name="fuzz-send", daemon=True)
    sender.start()
    right.set_timeout(10)  # a case never waits for ever, even on a bug
    try:
        header, tensors, _ = right.recv()
    except TransportError:
        assert right.closed
    else:  # a valid frame: its known fields check out, plain values came out plain
        check_header(header)
        assert isinstance(tensors, dict)
    finally:
        right.close()
        _no_thread_left([sender])


_FRAME_EXAMPLES = [
    _frame([{**_ENTRY, "codec": ["none"]}]),  # an unhashable codec: was a TypeError
    _frame([{**_ENTRY, "shape": [0, 2**70], "raw_nbytes": 0, "encoded_nbytes": 0,
             "chunks": []}]),  # a huge dim beside a zero: was an overflow in torch
]


def _with_frame_examples(test):
    for frame in _FRAME_EXAMPLES:
        test = example(frame)(test)
    return test


@_cases(long=False)
@given(frames())
@_with_frame_examples
def test_only_transport_errors_or_valid_frames_come_out_of_the_parser(frame):
    _throw_frame(frame)


@pytest.mark.long
@_cases(long=True)
@given(frames())
@_with_frame_examples
def test_only_transport_errors_or_valid_frames_come_out_of_the_parser_long(frame):
    _throw_frame(frame)


# -- handshakes ----------------------------------------------------------------------------------
SECRET = bytes(range(32))


@st.composite
def replies(draw):
    """What a peer says to a DataServer's greeting: garbage, a plausible reply with any
    name and a wrong proof, a correct proof for a name it sends differently, truncated or
    padded; sometimes the exact reply of a peer holding its link's key."""
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(st.binary(max_size=400)), False
    mode = draw(st.sampled_from([b"\x00", b"\x00", b"\x01", b"\x07"]))
    name = draw(st.text(min_size=1, max_size=12)).encode()[:255] or b"x"
    said = draw(st.sampled_from([len(name), len(name), 0, 255, len(name) + 1]))
    body = mode + draw(st.binary(min_size=32, max_size=32)) + bytes([said]) + name
    if kind == 1:  # the right proof (honest) when the peer says what it means
        return body, True
    proof = draw(st.binary(min_size=32, max_size=32))
    data = body + proof
    if kind == 2:
        data = data[: draw(st.integers(0, len(data)))]
    elif kind == 3:
        data += draw(st.binary(max_size=64))
    return data, False


class _Greeter:
    """A DataServer that anyone may reach (the run's secret, any name), for the fuzzer."""

    def __init__(self) -> None:
        self.server = DataServer("127.0.0.1", 0, SECRET, RAW, name="cloud",
                                 handshake_timeout=5.0)

    def speak(self, data: bytes, honest: bool) -> None:
        s = socket.create_connection(self.server.address, timeout=10)
        try:
            hello = auth.recv_exact(s, auth.HELLO_HEAD + len(b"cloud"), time.monotonic() + 10)
            if honest:  # prove the link's key for the name said (if the name is sayable)
                said = data[auth.REPLY_HEAD - 1]
                name = data[auth.REPLY_HEAD : auth.REPLY_HEAD + said]
                try:
                    key = link_key(SECRET, "cloud", name.decode("utf-8"))
                except (UnicodeDecodeError, TransportError):
                    honest, key = False, SECRET
                data = data + hmac.new(key, b"client" + hello + data, "sha256").digest()
                honest = honest and data[:1] == b"\x00" and said == len(name)
            try:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)  # all it will ever say
            except OSError:  # refused while we were still talking
                pass
            got = b""
            while True:  # the server's answer, then its close; or just its close
                try:
                    chunk = s.recv(64)
                except ConnectionResetError:  # closed with our extra bytes unread
                    break
                if not chunk:
                    break
                got += chunk
                if honest and len(got) == auth.DIGEST:
                    break
        finally:
            s.close()
        if honest:
            assert len(got) == auth.DIGEST, got
            self.server.accept(timeout=10).close()  # a valid channel came out
        else:
            assert got == b"", got  # refused: no answer, closed
        deadline = time.monotonic() + 10
        while self.server.pending and time.monotonic() < deadline:
            time.sleep(0.005)
        assert self.server.pending == 0

    def close(self) -> None:
        self.server.close()
        _no_thread_left([self.server._loop_thread])


@pytest.fixture(scope="module")
def greeter():
    g = _Greeter()
    yield g
    g.close()


_HONEST = (b"\x00" + bytes(32) + bytes([4]) + b"edge", True)  # a valid channel comes out


@_cases(long=False)
@given(replies())
@example(_HONEST)
def test_a_data_server_refuses_every_handshake_but_a_proven_one(greeter, reply):
    greeter.speak(*reply)


@pytest.mark.long
@_cases(long=True)
@given(replies())
@example(_HONEST)
def test_a_data_server_refuses_every_handshake_but_a_proven_one_long(greeter, reply):
    greeter.speak(*reply)


@st.composite
def hellos(draw):
    """What a server (or someone on the path) says to a connecting client."""
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return draw(st.binary(max_size=200))
    magic = auth.MAGIC if draw(st.integers(0, 5)) else draw(st.binary(min_size=8, max_size=8))
    version = auth.VERSION if draw(st.integers(0, 5)) else draw(st.integers(0, 255))
    mode = draw(st.sampled_from([b"\x00", b"\x01", b"\x09"]))
    name = draw(st.sampled_from([b"cloud", b"mid", b"", "cl\u00f6ud".encode(), b"\xff\xfe"]))
    said = draw(st.sampled_from([len(name), len(name), 0, 255]))
    hello = magic + bytes([version]) + mode + draw(st.binary(min_size=32, max_size=32))
    hello += bytes([said]) + name
    if kind == 1:
        hello = hello[: draw(st.integers(0, len(hello)))]
    return hello + draw(st.binary(max_size=48))  # an answer, a wrong one mostly


def _greet_a_client(hello: bytes) -> None:
    a, b = socket.socketpair()
    out: list = []

    def client() -> None:
        try:
            out.append(auth.client_handshake(a, link_key(SECRET, "cloud", "edge"), False,
                                             time.monotonic() + 10, name="edge",
                                             partner="cloud"))
        except TransportError as exc:
            out.append(exc)

    t = threading.Thread(target=client, name="fuzz-client", daemon=True)
    t.start()
    try:
        b.sendall(hello)
    except OSError:
        pass  # the client hung up first
    b.shutdown(socket.SHUT_WR)
    _no_thread_left([t])
    a.close()
    b.close()
    assert len(out) == 1 and isinstance(out[0], TransportError), out  # no key: no session


@_cases(long=False)
@given(hellos())
def test_a_client_refuses_every_greeting_of_a_server_without_the_key(hello):
    _greet_a_client(hello)


@pytest.mark.long
@_cases(long=True)
@given(hellos())
def test_a_client_refuses_every_greeting_of_a_server_without_the_key_long(hello):
    _greet_a_client(hello)
