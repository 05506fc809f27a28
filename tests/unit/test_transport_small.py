"""Small frames take a shorter path (cached table, one read, numpy-built tensors); it must
give exactly what the general path gives, own its memory, and still check every frame."""

from __future__ import annotations

import socket

import pytest
import torch

from experiment_design.transport import CodecConfig, DataChannel, ProtocolError, derive
from experiment_design.transport.frame import MAGIC, PREFIX, VERSION

RAW = CodecConfig(codec="none", level=0, filter="none")


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    client, server = derive(bytes(32), bytes(32), bytes(32), encrypt=False)
    left, right = DataChannel(a, RAW, session=client), DataChannel(b, RAW, session=server)
    yield left, right
    left.close()
    right.close()


def _small() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    base = torch.randn(2, 3, 4, generator=g)
    return {
        "f32": base,
        "f16": base.half(),
        "bf16": base.bfloat16(),  # no numpy twin: general path
        "f64": base.double(),
        "i64": torch.randint(-9, 9, (5,), generator=g),
        "i8": torch.randint(-9, 9, (2, 2), generator=g).to(torch.int8),
        "bool": base > 0,
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 3),
        "strided": base.transpose(0, 2),  # not contiguous: general path
        "grad": torch.ones(3, requires_grad=True),  # needs detach: general path
    }


def test_small_frames_round_trip_every_dtype_and_layout(pair):
    left, right = pair
    sent = _small()
    for name, t in sent.items():  # one tensor per frame, then all together
        left.send({"name": name}, {name: t})
        header, got, stats = right.recv()
        assert header == {"name": name} and list(got) == [name]
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name], t.detach()), name
        assert stats.raw_bytes == t.nbytes and stats.codec == "none"
    left.send({"all": True}, sent)
    _, got, _ = right.recv()
    assert list(got) == list(sent)
    assert all(torch.equal(got[k], v.detach()) for k, v in sent.items())


def test_received_small_tensors_own_their_memory(pair):
    left, right = pair
    left.send({"i": 0}, {"x": torch.zeros(1, 10)})
    left.send({"i": 1}, {"x": torch.ones(1, 10)})
    _, first, _ = right.recv()
    _, second, _ = right.recv()  # reuses the read-ahead buffer
    assert torch.equal(first["x"], torch.zeros(1, 10))
    first["x"] += 5  # writable, and not shared with the next frame
    assert torch.equal(second["x"], torch.ones(1, 10))


def test_changing_shapes_and_headers_are_read_in_step(pair):
    left, right = pair
    for i in range(6):
        shape = (1, 10) if i % 2 else (2, 5 + i)
        left.send({"i": i, "nested": {"k": [i, None, "é"]}}, {"x": torch.full(shape, float(i))})
    for i in range(6):
        header, got, stats = right.recv()
        shape = (1, 10) if i % 2 else (2, 5 + i)
        assert header == {"i": i, "nested": {"k": [i, None, "é"]}}
        assert got["x"].shape == shape and float(got["x"][0, 0]) == i
        assert stats.wire_bytes > stats.raw_bytes


def test_a_known_table_with_lying_counts_is_still_rejected(pair):
    left, right = pair
    left.send({"i": 0}, {"x": torch.zeros(4)})
    right.recv()  # the table is now cached on the receiving side
    table = b'[{"name":"x","dtype":"float32","shape":[4],"raw_nbytes":16,'
    table += b'"encoded_nbytes":16,"codec":"none","chunks":[16]}]'
    text = b"{}"
    # the same table, but the prefix declares 32 payload bytes
    frame = PREFIX.pack(MAGIC, VERSION, 0, 1, len(table), len(text), 32) + table + text
    left.send_packed(frame, [bytes(32)])
    with pytest.raises(ProtocolError):
        right.recv()
    assert right.closed


@pytest.mark.parametrize("text", [b" {}", b'{"a":1} ', b'{"a":1}x', b"[1]", b"\xff"])
def test_caller_headers_are_parsed_strictly(pair, text):
    left, right = pair
    frame = PREFIX.pack(MAGIC, VERSION, 0, 0, 2, len(text), 0) + b"[]" + text
    left.send_packed(frame)
    if text.strip().startswith(b"{") and text.strip().endswith(b"}"):
        header, _, _ = right.recv()  # whitespace around an object is fine JSON
        assert isinstance(header, dict)
    else:
        with pytest.raises(ProtocolError):
            right.recv()
