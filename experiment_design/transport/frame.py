"""The frame: a fixed binary prefix, a JSON header, then the tensor buffers back to back.

::

    prefix  "!4sBBHIQ"  magic b"TRCF", version, flags (0), buffer count, header length, payload length
    header  UTF-8 JSON  {"h": <caller's header>, "t": [<tensor entry>, ...]}
    payload the chunks of every tensor in entry order, exactly ``payload length`` bytes

Everything a peer declares is checked against :class:`Limits` before any memory is set
aside for it, and the JSON entries must add up to the prefix's counts, so a confused or
hostile peer costs at most one rejected frame.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.transport.codec import EncodedTensor, TensorEntry, parse_entry
from experiment_design.transport.errors import ProtocolError

MAGIC = b"TRCF"
VERSION = 1
PREFIX = struct.Struct("!4sBBHIQ")
# One encoder for every frame: json.dumps() with options builds a new encoder per call.
_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
_DECODE = json.JSONDecoder().decode
_ENTRY_TEXT: dict[tuple, str] = {}


@dataclass(frozen=True)
class Limits:
    """What a receiver accepts from a peer in one frame."""

    max_header_bytes: int = 1 << 20
    max_buffers: int = 4096
    max_message_bytes: int = 1 << 31  # raw (decoded) and encoded bytes, each


def pack_head(header: dict[str, Any], tensors: Sequence[EncodedTensor]) -> bytes:
    """Prefix + JSON header for a frame carrying ``tensors``."""
    if not isinstance(header, dict):
        raise TracrError(f"a message header must be a dict, got {type(header).__name__}")
    nbuf = payload = 0
    entries = []
    for t in tensors:
        entries.append(_entry_text(t))
        nbuf += len(t.chunks)
        payload += t.encoded_nbytes
    try:
        text = ('{"h":' + _ENCODE(header) + ',"t":[' + ",".join(entries) + "]}").encode()
    except (TypeError, ValueError) as exc:
        raise TracrError(
            f"message header is not plain JSON: {exc}",
            hint="headers carry str/int/float/bool/None and lists/dicts of them; tensors go separately",
        ) from None
    return PREFIX.pack(MAGIC, VERSION, 0, nbuf, len(text), payload) + text


def _entry_text(t: EncodedTensor) -> str:
    # A split sends the same names and shapes on every inference, so the JSON of a raw
    # tensor's entry is worth remembering; compressed entries carry varying sizes.
    if t.codec != "none":
        return _ENCODE(t.entry())
    key = (t.name, t.dtype, t.shape, t.raw_nbytes)
    text = _ENTRY_TEXT.get(key)
    if text is None:
        if len(_ENTRY_TEXT) >= 1024:
            _ENTRY_TEXT.clear()
        text = _ENTRY_TEXT[key] = _ENCODE(t.entry())
    return text


def parse_prefix(raw: bytes, limits: Limits) -> tuple[int, int, int]:
    """Check a prefix; returns (buffer count, header length, payload length)."""
    magic, version, _flags, nbuf, hlen, plen = PREFIX.unpack(raw)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic!r}: the peer is not speaking tracr frames")
    if version != VERSION:
        raise ProtocolError(
            f"frame version {version} is not supported (this side speaks {VERSION})"
        )
    if hlen > limits.max_header_bytes:
        raise ProtocolError(f"frame header of {hlen} bytes exceeds {limits.max_header_bytes}")
    if nbuf > limits.max_buffers:
        raise ProtocolError(f"frame declares {nbuf} buffers, more than {limits.max_buffers}")
    if plen > limits.max_message_bytes:
        raise ProtocolError(f"frame payload of {plen} bytes exceeds {limits.max_message_bytes}")
    return nbuf, hlen, plen


def parse_header(
    text: bytes, nbuf: int, plen: int, limits: Limits
) -> tuple[dict[str, Any], list[TensorEntry]]:
    """Decode and cross-check the JSON header against the prefix."""
    try:
        obj = _DECODE(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"frame header is not JSON: {exc}") from None
    if (
        not isinstance(obj, dict)
        or not isinstance(obj.get("h"), dict)
        or not isinstance(obj.get("t"), list)
    ):
        raise ProtocolError("frame header lacks the 'h' object or the 't' list")
    entries = [parse_entry(e) for e in obj["t"]]
    chunks = encoded = raw = 0
    for e in entries:
        chunks += len(e.chunks)
        encoded += e.encoded_nbytes
        raw += e.raw_nbytes
    if chunks != nbuf or encoded != plen:
        raise ProtocolError("frame header and prefix disagree on the payload")
    if raw > limits.max_message_bytes:
        raise ProtocolError(f"frame decodes to more than {limits.max_message_bytes} bytes")
    if len(entries) > 1 and len({e.name for e in entries}) != len(entries):
        raise ProtocolError("frame carries two tensors with the same name")
    return obj["h"], entries
