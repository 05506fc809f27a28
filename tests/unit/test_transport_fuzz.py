"""A frame fuzzer: generated prefixes, tensor tables, headers and payloads, sealed with
the session's keys (as an authenticated but confused or hostile peer would send them),
thrown at the receiving parser. Only a TransportError may ever come out, and a channel
that raised is closed."""

from __future__ import annotations

import json
import socket
import threading

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from experiment_design.constants import LOSSY
from experiment_design.transport import CodecConfig, DataChannel, TransportError, derive
from experiment_design.transport.codec import CODECS, DTYPES
from experiment_design.transport.frame import MAGIC, PREFIX, VERSION

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


@st.composite
def frames(draw):
    table = _text(draw, st.lists(entries(), max_size=3))
    header = _text(draw, st.dictionaries(st.text(max_size=6), json_values, max_size=4) | json_values)
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


@settings(max_examples=1000, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(frames())
@example(_frame([{**_ENTRY, "codec": ["none"]}]))  # an unhashable codec: was a TypeError
@example(_frame([{**_ENTRY, "shape": [0, 2**70], "raw_nbytes": 0, "encoded_nbytes": 0,
                  "chunks": []}]))  # a huge dim beside a zero: was an overflow in torch
def test_only_transport_errors_come_out_of_the_parser(frame):
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

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        right.recv()
    except TransportError:
        assert right.closed
    finally:
        right.close()
        sender.join(10)
