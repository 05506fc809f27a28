"""Plain values (ints, sizes, None, ...) crossing a real data channel beside tensors:
exact types back, never pickled, and a hostile peer's plain values refused."""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from collections import namedtuple

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiment_design.errors import TracrError
from experiment_design.transport import (
    CodecConfig,
    DataServer,
    Limits,
    ProtocolError,
    TransportError,
    connect,
)
from experiment_design.transport.channel import PLAIN_KEY
from experiment_design.transport.frame import MAGIC, PREFIX, VERSION
from experiment_design.transport.plain import (
    MAX_DEPTH,
    decode_plain,
    encode_plain,
    is_plain,
    plain_nbytes,
)

SECRET = os.urandom(32)


@contextlib.contextmanager
def channel_pair(codec: CodecConfig | None = None, limits: Limits | None = None):
    """(sender, receiver): two ends of one authenticated channel on 127.0.0.1."""
    cfg = codec or CodecConfig()
    server = DataServer("127.0.0.1", 0, SECRET, cfg, limits=limits)
    got: list = []
    t = threading.Thread(target=lambda: got.append(server.accept(timeout=10)), daemon=True)
    t.start()
    client = connect("127.0.0.1", server.address[1], SECRET, cfg)
    t.join(10)
    try:
        yield client, got[0]
    finally:
        client.close()
        got[0].close()
        server.close()


def same(a, b) -> bool:
    """Equal with exactly the same types all the way down (nan equals nan)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (a != a and b != b) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    return a == b


VALUES = {
    "n": 3,
    "zero": 0,
    "big": 2**62,
    "neg": -7,
    "f": 1.0,
    "half": 0.5,
    "negzero": -0.0,
    "nan": math.nan,
    "inf": math.inf,
    "ninf": -math.inf,
    "yes": True,
    "no": False,
    "none": None,
    "s": "mean",
    "size": torch.Size([1, 116, 8, 8]),
    "empty_size": torch.Size([]),
    "tup": (1, 2.0, None),
    "lst": [1, [2, (3,)]],
    "empty_tup": (),
    "empty_lst": [],
    "d": {"a": (1, False), "b": [None]},
    "dtype": torch.bfloat16,
    "device": torch.device("cpu"),
    "cuda": torch.device("cuda", 1),
}


@pytest.mark.parametrize(
    "codec",
    [CodecConfig(), CodecConfig(codec="zstd", filter="shuffle")],
    ids=["raw", "zstd"],
)
@pytest.mark.parametrize("tensors", ["none", "small", "large"])
def test_plain_values_cross_beside_tensors_with_their_exact_types(codec, tensors):
    sent = dict(VALUES)
    if tensors == "small":
        sent = {"x": torch.randn(2, 8), **sent, "idx": torch.arange(3)}
    elif tensors == "large":
        sent = {"x": torch.randn(64, 1024), **sent}
    with channel_pair(codec) as (a, b):
        a.send({"op": "run", "split": 7}, sent)
        header, back, stats = b.recv()
    assert header == {"op": "run", "split": 7}  # the plain values left the header
    assert set(back) == set(sent)
    for name, v in sent.items():
        assert same(back[name], v), name
    assert stats.raw_bytes == sum(
        v.numel() * v.element_size() for v in sent.values() if isinstance(v, torch.Tensor)
    )


def test_a_relayed_message_carries_its_plain_values_on():
    sent = {"x": torch.ones(3), "c": 58, "s": torch.Size([1, 58])}
    with channel_pair() as (a, b), channel_pair() as (c, d):
        a.send({"hop": 1}, sent)
        header, back, _ = b.recv()
        c.send(header, back)  # what a middle stage does
        header2, back2, _ = d.recv()
    assert header2 == {"hop": 1}
    assert all(same(back2[k], v) for k, v in sent.items())


Point = namedtuple("Point", "x y")


@pytest.mark.parametrize(
    "value",
    [object(), np.int64(3), {1, 2}, {1: "a"}, Point(1, 2), b"bytes",
     (1, torch.zeros(1)), [torch.zeros(1)]],
    ids=lambda v: type(v).__name__,
)
def test_what_is_not_plain_data_is_refused_at_send_and_the_channel_goes_on(value):
    assert not is_plain(value)
    with channel_pair() as (a, b):
        with pytest.raises(TracrError, match="'bad' cannot cross"):
            a.send({}, {"x": torch.ones(2), "bad": value})
        a.send({"op": "next"}, {"n": 1})
        header, back, _ = b.recv()
    assert header == {"op": "next"} and same(back["n"], 1)


def test_the_plain_header_key_is_reserved_to_the_channel():
    with channel_pair() as (a, _b):
        with pytest.raises(TracrError, match="reserved"):
            a.send({PLAIN_KEY: {}}, {"n": 1})


def _plain_frame(plain_text: bytes, table: bytes = b"[]", payload: bytes = b"") -> bytes:
    header = b'{"op":"x","' + PLAIN_KEY.encode() + b'":' + plain_text + b"}"
    nbuf = 1 if payload else 0
    return PREFIX.pack(MAGIC, VERSION, 0, nbuf, len(table), len(header), len(payload)) + (
        table + header
    )


_X = json.dumps([{"name": "x", "dtype": "float32", "shape": [1], "raw_nbytes": 4,
                  "encoded_nbytes": 4, "codec": "none", "chunks": [4]}]).encode()


def _nested(depth: int) -> str:
    return '{"t":[' * depth + "1" + "]}" * depth


@pytest.mark.parametrize(
    "plain,table,payload",
    [
        (b"[1]", b"[]", b""),  # not a tagged dict of names
        (b'{"d":{"n":{"pickle":"gASV"}}}', b"[]", b""),  # unknown tag
        (b'{"d":{"n":{"t":[1],"s":[2]}}}', b"[]", b""),  # two tags
        (b'{"d":{"n":{"t":"12"}}}', b"[]", b""),  # a tag with the wrong content
        (b'{"d":{"n":{"s":[true]}}}', b"[]", b""),  # a bool in a size
        (b'{"d":{"n":{"s":[1e3]}}}', b"[]", b""),  # a float in a size
        (b'{"d":{"n":{"s":[99999999999999999999]}}}', b"[]", b""),  # beyond int64
        (b'{"d":{"n":{"f":"NaN"}}}', b"[]", b""),  # not one of nan/inf/-inf
        (b'{"d":{"n":NaN}}', b"[]", b""),  # JSON's own NaN literal, untagged
        (b'{"d":{"n":{"dtype":"Tensor"}}}', b"[]", b""),  # not a dtype
        (b'{"d":{"n":{"dtype":"__class__"}}}', b"[]", b""),
        (b'{"d":{"n":{"device":"cuda:0;x"}}}', b"[]", b""),  # not a device
        (('{"d":{"n":' + _nested(MAX_DEPTH + 1) + "}}").encode(), b"[]", b""),  # too deep
        (b'{"d":{"n":[' + b",".join([b"1"] * 200) + b"]}}", b"[]", b""),  # too many items
        (b'{"d":{"n":{"s":[' + b",".join([b"1"] * 200) + b"]}}}", b"[]", b""),
        (b'{"d":{"x":1}}', _X, bytes(4)),  # one name both a tensor and a plain value
    ],
    ids=[
        "not-tagged", "unknown-tag", "two-tags", "tag-content", "bool-in-size",
        "float-in-size", "huge-dim", "bad-special-float", "nan-literal", "bad-dtype",
        "dunder-dtype", "bad-device", "too-deep", "too-many-items", "size-too-long",
        "name-clash",
    ],
)
def test_a_hostile_peers_plain_values_are_a_protocol_error(plain, table, payload):
    with channel_pair(limits=Limits(max_plain_items=100)) as (a, b):
        a.send_packed(_plain_frame(plain, table, payload), [payload] if payload else [])
        with pytest.raises(ProtocolError):
            b.recv()
        assert b.closed


def test_the_item_limit_counts_every_value_of_a_frame():
    many = {f"v{i}": i for i in range(60)}
    with channel_pair(limits=Limits(max_plain_items=100)) as (a, b):
        a.send({}, dict(list(many.items())[:30]))
        _, back, _ = b.recv()
        assert len(back) == 30
        a.send({}, {**many, "more": list(range(60))})
        with pytest.raises(ProtocolError, match="too many"):
            b.recv()


def test_plain_nbytes_is_the_encoded_size():
    assert plain_nbytes(58) == 2
    assert plain_nbytes(torch.Size([1, 116])) == len('{"s":[1,116]}')
    assert plain_nbytes(None) == 4


plain_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=8)
    | st.lists(st.integers(0, 2**40), max_size=4).map(torch.Size)
    | st.sampled_from([torch.float32, torch.int64, torch.bool, torch.device("cpu")]),
    lambda inner: st.lists(inner, max_size=4)
    | st.lists(inner, max_size=4).map(tuple)
    | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=16,
)


@settings(max_examples=300, deadline=None, database=None)
@given(plain_values)
def test_every_plain_value_round_trips_through_its_json_form(value):
    text = json.dumps(encode_plain(value), allow_nan=False)
    assert same(decode_plain(json.loads(text)), value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
    | st.sampled_from(["t", "s", "d", "f", "dtype", "device", "nan", "float32", "cpu"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["t", "s", "d", "f", "dtype", "device", "x"]), inner,
                      max_size=2),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_decoding_anything_gives_plain_data_or_a_protocol_error(obj):
    try:
        value = decode_plain(obj)
    except ProtocolError:
        return
    assert is_plain(value)
    assert same(decode_plain(encode_plain(value)), value)


def test_fuzzed_plain_headers_over_a_channel_only_raise_transport_errors():
    # a handful of the generator's shapes, each over the wire, sealed (past the tag check)
    for obj in [{"d": {"a": {"t": [1, {"s": [2]}]}}}, {"d": {"a": {"x": 1}}}, {"d": 3},
                {"d": {"a": [{"f": "inf"}, {"dtype": "int8"}, {"device": "meta"}]}}]:
        with channel_pair() as (a, b):
            a.send_packed(_plain_frame(json.dumps(obj).encode()))
            try:
                _, back, _ = b.recv()
            except TransportError:
                assert b.closed
                continue
            assert all(is_plain(v) for v in back.values())
