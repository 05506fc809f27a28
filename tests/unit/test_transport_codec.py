"""Codec and frame rules of the data path, without sockets."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from experiment_design.errors import TracrError, UnknownNameError
from experiment_design.transport import CODECS, FILTERS, CodecConfig, Limits, ProtocolError
from experiment_design.transport.codec import (
    decompress_into,
    encode_tensor,
    parse_entry,
    tensor_from,
)
from experiment_design.transport.frame import (
    PREFIX,
    VERSION,
    pack_head,
    parse_caller_header,
    parse_header,
    parse_prefix,
    parse_table,
)

PACKAGE = Path(__file__).resolve().parents[2] / "experiment_design" / "transport"


def _samples() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = torch.relu(torch.randn(4, 8, 64, generator=g)).round(decimals=2)
    sparse = torch.zeros(4, 1024)
    sparse.view(-1)[::7] = 1.5
    return {
        "sparse": sparse,
        "f32": base,
        "f16": base.half(),
        "bf16": base.bfloat16(),
        "f64": base.double()[0],
        "i64": torch.randint(-1000, 1000, (5, 7), generator=g),
        "u8": torch.randint(0, 255, (3, 8, 8), generator=g).to(torch.uint8),
        "bool": base > 0.5,
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "strided": base.transpose(1, 2),  # not contiguous
    }


def _roundtrip(t: torch.Tensor, cfg: CodecConfig) -> torch.Tensor:
    enc = encode_tensor("x", t, cfg)
    entry = parse_entry(json.loads(json.dumps(enc.entry())))
    if entry.raw_nbytes == 0:
        return tensor_from(entry, None)
    payload = b"".join(bytes(b) for b in enc.buffers)
    dst = bytearray(entry.raw_nbytes)
    if entry.codec == "none":
        dst[:] = payload
    else:
        decompress_into(entry, memoryview(payload), dst)
    return tensor_from(entry, dst)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("filt", FILTERS)
def test_every_codec_and_filter_round_trips_every_dtype(codec, filt):
    cfg = CodecConfig(codec=codec, level=5, filter=filt)
    assert encode_tensor("x", _samples()["sparse"], cfg).codec == codec  # compressed for real
    for name, t in _samples().items():
        back = _roundtrip(t, cfg)
        assert back.dtype == t.dtype and back.shape == t.shape, name
        assert torch.equal(back, t), name


def test_compression_shrinks_sparse_activations_and_none_sends_raw():
    t = torch.relu(torch.randn(64, 1024, generator=torch.Generator().manual_seed(1)))
    raw = encode_tensor("x", t, CodecConfig(codec="none"))
    packed = encode_tensor("x", t, CodecConfig(codec="zstd", level=3, filter="shuffle"))
    assert raw.encoded_nbytes == raw.raw_nbytes == t.numel() * 4
    assert packed.encoded_nbytes < 0.8 * raw.raw_nbytes


def test_incompressible_tensors_fall_back_to_raw_bytes():
    noise = torch.randint(
        0, 256, (4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(2)
    )
    enc = encode_tensor("x", noise, CodecConfig(codec="zstd", filter="none"))
    assert enc.codec == "none" and enc.encoded_nbytes == 4096
    assert torch.equal(_roundtrip(noise, CodecConfig(codec="zstd")), noise)


def test_requires_grad_tensors_are_sent_by_value():
    t = torch.randn(3, 3, requires_grad=True)
    assert torch.equal(_roundtrip(t, CodecConfig()), t.detach())


def test_codec_config_validation():
    assert CodecConfig.from_dict(None) == CodecConfig()
    assert CodecConfig.from_dict({"codec": "lz4", "level": 0}).to_dict()["codec"] == "lz4"
    with pytest.raises(UnknownNameError, match="zstd"):
        CodecConfig(codec="zstdd")
    with pytest.raises(UnknownNameError):
        CodecConfig(filter="delta")
    with pytest.raises(TracrError, match="0-9"):
        CodecConfig(level=10)
    with pytest.raises(TracrError, match="unknown transport setting"):
        CodecConfig.from_dict({"codec": "zstd", "compression": 3})


def test_unsupported_values_are_user_errors():
    with pytest.raises(TracrError, match="complex64"):
        encode_tensor("x", torch.zeros(2, dtype=torch.complex64), CodecConfig())
    with pytest.raises(TracrError, match="not a tensor"):
        encode_tensor("x", [1, 2, 3], CodecConfig())
    with pytest.raises(TracrError, match="JSON"):
        pack_head({"when": object()}, [])


def _entry(**over):
    e = {
        "name": "x",
        "dtype": "float32",
        "shape": [2, 2],
        "raw_nbytes": 16,
        "encoded_nbytes": 16,
        "codec": "none",
        "chunks": [16],
    }
    e.update(over)
    return e


@pytest.mark.parametrize(
    "bad",
    [
        _entry(shape=[2, 3]),  # shape disagrees with size
        _entry(dtype="object"),
        _entry(codec="pickle"),
        _entry(shape=[-1, -16]),
        _entry(chunks=[8, 8]),
        _entry(encoded_nbytes=17),
        _entry(shape=[1] * 40, raw_nbytes=4, encoded_nbytes=4, chunks=[4]),
        _entry(raw_nbytes=True),
        "x",
    ],
)
def test_inconsistent_tensor_entries_are_rejected(bad):
    with pytest.raises(ProtocolError):
        parse_entry(bad)


def test_prefix_and_header_limits():
    limits = Limits(max_header_bytes=1024, max_buffers=4, max_message_bytes=1 << 20)
    ok = PREFIX.pack(b"TRCF", VERSION, 0, 1, 100, 50, 16)
    assert parse_prefix(ok, limits) == (1, 100, 50, 16)
    assert parse_prefix(b"junk" + ok, limits, 4) == (1, 100, 50, 16)
    for bad in (
        PREFIX.pack(b"HTTP", VERSION, 0, 1, 100, 50, 16),
        PREFIX.pack(b"TRCF", 1, 0, 1, 100, 50, 16),  # version 1 (JSON-only header) is gone
        PREFIX.pack(b"TRCF", VERSION, 0, 1, 1000, 100, 16),  # table + header over the limit
        PREFIX.pack(b"TRCF", VERSION, 0, 50, 100, 50, 16),
        PREFIX.pack(b"TRCF", VERSION, 0, 1, 100, 50, 1 << 40),
    ):
        with pytest.raises(ProtocolError):
            parse_prefix(bad, limits)
    table = json.dumps([_entry()]).encode()
    assert parse_table(table, 1, 16, limits).entries[0].shape == (2, 2)
    assert parse_table(table, 1, 16, limits).codec == "none"  # second time: from the cache
    with pytest.raises(ProtocolError):
        parse_table(table, 1, 15, limits)  # payload length disagrees (cached table too)
    head = table + b'{"op":"x"}'
    assert parse_header(head, len(table), 1, 16, limits)[0] == {"op": "x"}
    with pytest.raises(ProtocolError):
        parse_table(b"\xff\xfe not json", 0, 0, limits)
    with pytest.raises(ProtocolError):
        parse_table(b"{}", 0, 0, limits)
    with pytest.raises(ProtocolError):
        parse_caller_header(b"[]")
    with pytest.raises(ProtocolError):
        parse_caller_header(b"\xff not json")
    bomb = _entry(
        shape=[1 << 20, 1 << 10],
        raw_nbytes=1 << 32,
        codec="zstd",
        encoded_nbytes=16,
        chunks=[16] * 16,
    )
    with pytest.raises(ProtocolError):
        parse_table(json.dumps([bomb]).encode(), 16, 16 * 16, limits)
    with pytest.raises(ProtocolError):  # two tensors under one name
        parse_table(json.dumps([_entry(), _entry()]).encode(), 2, 32, limits)


def test_frame_head_reuses_the_table_of_a_repeated_split():
    t = torch.ones(1, 10)
    cfg = CodecConfig(codec="none")
    first = pack_head({"i": 1}, [encode_tensor("x", t, cfg)])
    second = pack_head({"i": 2}, [encode_tensor("x", t * 2, cfg)])
    limits = Limits()
    for head, i in ((first, 1), (second, 2)):
        nbuf, tlen, hlen, plen = parse_prefix(head, limits)
        assert len(head) == PREFIX.size + tlen + hlen and plen == 40
        header, entries = parse_header(head[PREFIX.size :], tlen, nbuf, plen, limits)
        assert header == {"i": i} and entries[0].name == "x"
    assert first[PREFIX.size : PREFIX.size + tlen] == second[PREFIX.size : PREFIX.size + tlen]


def test_corrupt_blosc2_chunk_is_a_protocol_error():
    t = torch.relu(torch.randn(4096))
    enc = encode_tensor("x", t, CodecConfig(codec="zstd"))
    entry = parse_entry(enc.entry())
    junk = bytearray(bytes(enc.buffers[0]))
    junk[: len(junk) // 2] = b"\x07" * (len(junk) // 2)
    with pytest.raises(ProtocolError):
        decompress_into(entry, memoryview(junk), bytearray(entry.raw_nbytes))


def test_transport_package_never_pickles_and_stays_light():
    forbidden = re.compile(
        r"^\s*(import|from)\s+(pickle|cPickle|dill|cloudpickle|app_api|rich|matplotlib|plumbum)\b",
        re.M,
    )
    for path in PACKAGE.glob("*.py"):
        text = path.read_text()
        assert not forbidden.search(text), path.name
        assert "torch.save" not in text and "torch.load" not in text, path.name
        # blosc2 only inside functions: a device without it still sends raw tensors
        assert not re.search(r"^(import|from) blosc2", text, re.M), path.name
