"""The frame: a fixed binary prefix, the tensor table, the caller's header, then the payload.

::

    prefix  "!4sBBHIIQ"  magic b"TRCF", version, flags (0), buffer count, table length,
                         header length, payload length
    table   UTF-8 JSON   [<tensor entry>, ...]   (name, dtype, shape, sizes, codec, chunks,
                         and "lossy" for a reduced tensor: its method and parameters)
    header  UTF-8 JSON   the caller's header (an object)
    tag     16 bytes     AES-GCM tag over prefix, table and header (table and header
                         encrypted when the session encrypts)
    payload the chunks of every tensor in entry order, exactly ``payload length`` bytes
    tag     16 bytes     AES-GCM tag over the payload (only when payload length > 0)

The tags and the sequence numbers in their nonces belong to the channel's session
(``session.py``); this module packs and checks the cleartext parts.

The table and the caller's header are separate so that the table, which is the same on
every inference of a split (same names, dtypes and shapes), is encoded once by the
sender and validated once by the receiver; later frames reuse the cached text and the
cached validated entries. Compressed tensors (varying chunk sizes) and reduced ones
(an image's scales and sizes vary per frame) are encoded afresh per frame; the
receiver's cache is keyed on the table's exact bytes, so two tables that differ in one
scale are two tables.
Everything a peer declares is checked against :class:`Limits` before any memory is set
aside for it, and the entries must add up to the prefix's counts, so a confused or
hostile peer costs at most one rejected frame.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from experiment_design.errors import TracrError
from experiment_design.transport.codec import (
    DTYPES,
    EncodedTensor,
    TensorEntry,
    parse_entry,
)
from experiment_design.transport.errors import ProtocolError

MAGIC = b"TRCF"
VERSION = 5  # 4: tensor entries may carry "lossy"; 5: int8/int4 parameters in the payload
PREFIX = struct.Struct("!4sBBHIIQ")
# One encoder for every frame: json.dumps() with options builds a new encoder per call.
_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def _not_json(o: object) -> Any:
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


# The C encoder behind json.dumps, built once: the caller's header is encoded on every
# frame. No circular-reference markers: a circular header ends in RecursionError instead.
_c_make = getattr(json.encoder, "c_make_encoder", None)
_C_ENCODE = (
    _c_make(
        None, _not_json, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, False
    )
    if _c_make is not None
    else None
)


def encode_header(header: dict[str, Any]) -> bytes:
    """The caller's header as compact JSON bytes; anything not plain JSON is a :class:`TracrError`."""
    if not isinstance(header, dict):
        raise TracrError(f"a message header must be a dict, got {type(header).__name__}")
    try:
        if _C_ENCODE is not None:
            return "".join(_C_ENCODE(header, 0)).encode()
        return _ENCODE(header).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise TracrError(
            f"message header is not plain JSON: {exc}",
            hint="headers carry str/int/float/bool/None and lists/dicts of them; tensors go separately",
        ) from None


def _no_constant(name: str) -> Any:
    # JSON's NaN / Infinity literals: no header or table field may be non-finite
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)
_DECODE = _DECODER.decode
_SCAN = json.scanner.make_scanner(_DECODER)  # C version where available
_NUMPY = {
    name: np.dtype(name) for name in DTYPES if name != "bfloat16"
}  # bfloat16 has no numpy twin
_WIRE_NAME = {dt: name for name, dt in _NUMPY.items()}
_CACHE_MAX = 256  # distinct tables remembered per process (each side)
_TABLE_CACHE_BYTES = 4096  # longer tables are not remembered
_SEND_TABLES: dict[tuple, bytes] = {}
_SMALL_TABLES: dict[tuple, tuple[bytes, int]] = {}
_RECV_TABLES: dict[bytes, Table] = {}


@dataclass(frozen=True)
class Limits:
    """What a receiver accepts from a peer in one frame."""

    max_header_bytes: int = 1 << 20  # table and caller header together
    max_buffers: int = 4096
    max_message_bytes: int = 1 << 31  # raw (decoded) and encoded bytes, each
    max_plain_items: int = 65536  # plain values (nested ones included) beside the tensors


#: The least a run's channels accept in one frame, whatever its model: the link probe
#: sends up to 1 MiB raw, and an adaptive partitioner's probes are of a cut's size.
RUN_FLOOR = 8 << 20


def run_limits(largest: int, slack: int = 2) -> Limits:
    """The limits of a run's data channels: a frame may declare (raw and encoded, each)
    at most ``slack`` times ``largest``, the most bytes the run puts in one frame (its
    model's largest set of crossing tensors, input and output included), and never less
    than :data:`RUN_FLOOR`. A peer that declares more is refused at the prefix or the
    table, before anything of that size is set aside."""
    return Limits(max_message_bytes=max(RUN_FLOOR, int(largest) * slack))


class Table(NamedTuple):
    """A validated tensor table and the totals a frame's prefix must agree with."""

    entries: tuple[TensorEntry, ...]
    chunks: int
    encoded: int
    raw: int
    codec: str  # codecs used, "none" for raw-only frames
    # For frames of raw, non-empty tensors whose dtype numpy knows: ((name, nbytes, numpy
    # dtype, shape), ...), so the receiver builds each tensor with two cheap calls.
    plan: tuple[tuple[str, int, Any, tuple[int, ...]], ...] | None = None
    params: int = 0  # bytes of lossy parameters in the table (counted as encoded bytes)


def pack_head(header: dict[str, Any], tensors: Sequence[EncodedTensor]) -> bytes:
    """Prefix + table + JSON header for a frame carrying ``tensors``."""
    text = encode_header(header)
    if not tensors:
        return PREFIX.pack(MAGIC, VERSION, 0, 0, 2, len(text), 0) + b"[]" + text
    table = _table_text(tensors)
    nbuf = payload = 0
    for t in tensors:
        nbuf += len(t.chunks)
        payload += t.encoded_nbytes
    return PREFIX.pack(MAGIC, VERSION, 0, nbuf, len(table), len(text), payload) + table + text


def _table_text(tensors: Sequence[EncodedTensor]) -> bytes:
    # Raw tensors' entries depend only on name, dtype and shape: a split sends the same
    # ones on every inference, so their text is built once. Compressed entries carry
    # per-frame chunk sizes, reduced ones a lossy object: both are always encoded afresh.
    key = []
    for t in tensors:
        if t.codec != "none" or t.lossy is not None:
            return ("[" + ",".join(_ENCODE(e.entry()) for e in tensors) + "]").encode()
        key.append((t.name, t.dtype, t.shape))
    k = tuple(key)
    text = _SEND_TABLES.get(k)
    if text is None:
        if len(_SEND_TABLES) >= _CACHE_MAX:
            _SEND_TABLES.clear()
        text = _SEND_TABLES[k] = (
            "[" + ",".join(_ENCODE(e.entry()) for e in tensors) + "]"
        ).encode()
    return text


def small_raw_table(key: tuple[tuple[str, Any, tuple[int, ...]], ...]) -> tuple[bytes, int]:
    """(table, buffer count) for raw, non-empty tensors given as ((name, numpy dtype, shape), ...)."""
    hit = _SMALL_TABLES.get(key)
    if hit is None:
        entries = []
        for name, npdtype, shape in key:
            dname = _WIRE_NAME.get(npdtype)
            if dname is None:
                raise TracrError(f"tensors of numpy dtype {npdtype} cannot cross the data path")
            n = DTYPES[dname][1]
            for d in shape:
                n *= d
            entries.append(EncodedTensor(name, dname, tuple(shape), n, "none", [n], []))
        if len(_SMALL_TABLES) >= _CACHE_MAX:
            _SMALL_TABLES.clear()
        hit = _SMALL_TABLES[key] = (_table_text(entries), len(entries))
    return hit


def parse_prefix(
    raw: bytes | bytearray | memoryview, limits: Limits, offset: int = 0
) -> tuple[int, int, int, int]:
    """Check a prefix (at ``offset`` of ``raw``); returns (buffers, table length, header length, payload length)."""
    magic, version, _flags, nbuf, tlen, hlen, plen = PREFIX.unpack_from(raw, offset)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic!r}: the peer is not speaking tracr frames")
    if version != VERSION:
        raise ProtocolError(
            f"frame version {version} is not supported (this side speaks {VERSION})"
        )
    if tlen + hlen > limits.max_header_bytes:
        raise ProtocolError(
            f"frame header of {tlen + hlen} bytes exceeds {limits.max_header_bytes}"
        )
    if nbuf > limits.max_buffers:
        raise ProtocolError(f"frame declares {nbuf} buffers, more than {limits.max_buffers}")
    if plen > limits.max_message_bytes:
        raise ProtocolError(f"frame payload of {plen} bytes exceeds {limits.max_message_bytes}")
    return nbuf, tlen, hlen, plen


def parse_table(text: bytes, nbuf: int, plen: int, limits: Limits) -> Table:
    """Decode and validate a tensor table and cross-check it against the prefix.

    A table seen before is not parsed again (the cache holds only validated tables,
    keyed on their exact bytes, and is bounded)."""
    table = _RECV_TABLES.get(text)
    if table is None:
        table = _validate_table(text, limits)
        if len(text) <= _TABLE_CACHE_BYTES:
            if len(_RECV_TABLES) >= _CACHE_MAX:
                _RECV_TABLES.clear()
            _RECV_TABLES[text] = table
    if table.chunks != nbuf or table.encoded != plen:
        raise ProtocolError("frame table and prefix disagree on the payload")
    if table.raw > limits.max_message_bytes:
        raise ProtocolError(f"frame decodes to more than {limits.max_message_bytes} bytes")
    return table


def _validate_table(text: bytes, limits: Limits) -> Table:
    try:
        obj = _DECODE(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"frame tensor table is not JSON: {exc}") from None
    if not isinstance(obj, list):
        raise ProtocolError("frame tensor table is not a list")
    entries = tuple(parse_entry(e) for e in obj)
    chunks = encoded = raw = params = 0
    codecs = set()
    for e in entries:
        params += e.param_nbytes
        chunks += len(e.chunks)
        encoded += e.encoded_nbytes
        raw += e.raw_nbytes
        codecs.add(e.codec)
    if len(entries) > 1 and len({e.name for e in entries}) != len(entries):
        raise ProtocolError("frame carries two tensors with the same name")
    if len(codecs) > 1:
        codecs.discard("none")
    plan = None
    if codecs <= {"none"} and all(e.raw_nbytes and e.dtype in _NUMPY for e in entries):
        plan = tuple((e.name, e.raw_nbytes, _NUMPY[e.dtype], e.shape) for e in entries)
    return Table(entries, chunks, encoded, raw, ",".join(sorted(codecs)) or "none", plan, params)


def parse_caller_header(text: bytes | bytearray) -> dict[str, Any]:
    """Decode the caller's JSON header (must be an object)."""
    try:
        s = text.decode("utf-8")
        obj, end = _SCAN(s, 0)  # the C scanner alone: no regex passes for whitespace
        if end != len(s):
            raise ValueError("trailing data")
    except (UnicodeDecodeError, ValueError, StopIteration, RecursionError):
        obj = _decode_slowly(text)  # the exact error (or a header padded with whitespace)
    if type(obj) is not dict:
        raise ProtocolError("frame header is not a JSON object")
    return obj


def _decode_slowly(text: bytes | bytearray) -> Any:
    try:
        return _DECODE(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"frame header is not JSON: {exc}") from None


def parse_header(
    text: bytes, tlen: int, nbuf: int, plen: int, limits: Limits
) -> tuple[dict[str, Any], tuple[TensorEntry, ...]]:
    """Table and caller header of a frame (``text`` holds both, table first)."""
    table = parse_table(bytes(text[:tlen]), nbuf, plen, limits)
    return parse_caller_header(bytes(text[tlen:])), table.entries
