"""How a tensor becomes bytes on the wire and back: raw buffers or blosc2 chunks, never pickle.

A tensor crosses as its plain memory (contiguous, on the CPU) plus a JSON description
(name, dtype, shape, sizes, codec). With a codec other than ``"none"`` the memory is
compressed with ``blosc2.compress2`` in chunks of at most :data:`CHUNK_BYTES` (blosc2
cannot take 2 GiB or more in one call), with ``typesize`` set to the element size so the
shuffle filters group bytes of equal significance. blosc2 is imported only when a codec
needs it, so a device without blosc2 can still send and receive raw tensors.

With ``lossy`` set, a floating tensor is first reduced (:mod:`.lossy`: a float16/bfloat16
cast, int8/int4 quantization, JPEG/WebP for an image batch) and the codec compresses the
reduced bytes; the entry's ``"lossy"`` object tells the receiver how to restore the
original dtype and shape. Integer and bool tensors always cross losslessly.

What to do is a :class:`~experiment_design.transport.codec_config.CodecConfig` (the
manifest's ``transport`` section, in ``codec_config.py``); it and :data:`RAW` are
imported from here too.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from experiment_design.constants import CODECS
from experiment_design.constants import FILTERS as FILTERS  # the package imports it from here
from experiment_design.errors import TracrError
from experiment_design.transport.codec_config import RAW as RAW  # imported from here too
from experiment_design.transport.codec_config import CodecConfig
from experiment_design.transport.errors import ProtocolError
from experiment_design.transport.lossy import (
    Lossy,
    check_reduced,
    param_nbytes,
    parse_lossy,
    reduce,
    restore_into,
)

_CODEC_SET = frozenset(CODECS)
CHUNK_BYTES = 1 << 28  # raw bytes per blosc2 chunk; blosc2's own limit is just under 2 GiB
MAX_DIMS = 32
MAX_DIM = 1 << 40  # one dimension; more overflows torch's shapes even when another dim is 0

# name on the wire -> (torch dtype, element size). bfloat16 has no numpy twin, so its bytes
# are handled through an int16 view; every dtype is moved as uint8 memory anyway.
DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "float32": (torch.float32, 4),
    "float16": (torch.float16, 2),
    "bfloat16": (torch.bfloat16, 2),
    "float64": (torch.float64, 8),
    "int64": (torch.int64, 8),
    "int32": (torch.int32, 4),
    "int16": (torch.int16, 2),
    "int8": (torch.int8, 1),
    "uint8": (torch.uint8, 1),
    "bool": (torch.bool, 1),
}
_NAME_OF = {dt: name for name, (dt, _) in DTYPES.items()}


def load_blosc2():
    """Import blosc2 (only codecs other than "none" need it)."""
    try:
        import blosc2
    except ImportError as exc:  # pragma: no cover - blosc2 is a dependency
        raise TracrError(
            "blosc2 is not installed, so compressed transport is unavailable",
            hint="install blosc2 or set transport.codec=none",
        ) from exc
    return blosc2


def _cparams(blosc2, cfg: CodecConfig, typesize: int) -> dict[str, Any]:
    filt = {
        "none": blosc2.Filter.NOFILTER,
        "shuffle": blosc2.Filter.SHUFFLE,
        "bitshuffle": blosc2.Filter.BITSHUFFLE,
    }[cfg.filter]
    return {
        "codec": getattr(blosc2.Codec, cfg.codec.upper()),
        "clevel": cfg.level,
        "typesize": typesize,
        "nthreads": cfg.nthreads,
        "filters": [filt],
        "filters_meta": [0],
    }


def dtype_name(dtype: torch.dtype) -> str:
    """The wire name of a torch dtype; unsupported dtypes are a user-fixable error."""
    try:
        return _NAME_OF[dtype]
    except KeyError:
        raise TracrError(
            f"tensors of dtype {dtype} cannot cross the data path",
            hint=f"supported dtypes: {', '.join(DTYPES)}",
        ) from None


def byte_view(tensor: torch.Tensor) -> memoryview:
    """The tensor's memory as a flat byte memoryview, without copying (tensor must be CPU, contiguous)."""
    if tensor.dtype is torch.bool:
        tensor = tensor.view(torch.uint8)
    elif tensor.dtype is torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return memoryview(tensor.numpy()).cast("B")


@dataclass
class EncodedTensor:
    """One tensor ready for the wire: its JSON entry plus the buffers to write after the header."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    raw_nbytes: int
    codec: str
    chunks: list[int]
    buffers: list[memoryview | bytes] = field(repr=False)
    keep: Any = field(default=None, repr=False)  # keeps the source memory alive while we send
    lossy: dict[str, Any] | None = None  # the entry's "lossy" object (see .lossy)

    @property
    def encoded_nbytes(self) -> int:
        """Bytes this tensor puts on the wire (payload only)."""
        return sum(self.chunks)

    @property
    def param_nbytes(self) -> int:
        """Bytes the reduction's parameters add to the table (an image's scales, offsets and
        sizes; a quantizer's scales and zero points are in the payload)."""
        return param_nbytes(self.lossy, _ENTRY_JSON)

    def payload(self) -> bytes:
        """The payload as one bytes object (what follows the header on the wire)."""
        return b"".join(bytes(b) for b in self.buffers)

    def entry(self) -> dict[str, Any]:
        """The tensor's description in the frame header."""
        e = {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "raw_nbytes": self.raw_nbytes,
            "encoded_nbytes": self.encoded_nbytes,
            "codec": self.codec,
            "chunks": self.chunks,
        }
        if self.lossy is not None:
            e["lossy"] = self.lossy
        return e


_ENTRY_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def encode_tensor(name: str, tensor: torch.Tensor, cfg: CodecConfig) -> EncodedTensor:
    """Encode one tensor: reduce it if ``cfg.lossy`` says so and it is floating (on its own
    device, so fewer bytes leave an accelerator), move it to the CPU, make it contiguous,
    compress if ``cfg`` says so.

    A tensor that does not shrink under compression is sent raw (its entry says
    ``"codec": "none"``), so a codec never makes a message larger than the tensor.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TracrError(
            f"'{name}' is a {type(tensor).__name__}, not a tensor; only tensors cross the data path",
            hint="put plain values in the message header instead",
        )
    dname = _NAME_OF.get(tensor.dtype) or dtype_name(tensor.dtype)
    t = tensor
    # Each step is skipped when not needed: this path runs for every crossing tensor.
    if t.requires_grad:
        t = t.detach()
    lossy = None
    if cfg.lossy != "none" and t.is_floating_point() and t.numel():
        reduced, lossy = reduce(t, cfg.lossy, cfg.granularity, cfg.quality)
        if reduced is not None:
            nbytes = t.numel() * DTYPES[dname][1]
            return _compress(name, dname, tuple(t.shape), nbytes, reduced, cfg, lossy)
    if not t.is_cpu:
        t = to_host(t)
    if not t.is_contiguous():
        t = t.contiguous()
    return _compress(name, dname, tuple(t.shape), t.nbytes, t, cfg, lossy)


def to_host(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the CPU. From a CUDA device it is copied into page-locked (pinned) host
    memory, which the copy engine writes directly (a pageable ``.cpu()`` goes through the
    driver's staging buffer in pieces), then the stream is waited for; the pinned block
    comes from torch's caching host allocator, so after the first inference of a shape
    nothing is allocated from the driver, and the tensor owns its block for as long as
    the frame holds it (a pipelined stage may send one while it computes the next)."""
    if t.device.type != "cuda":
        return t.cpu()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    torch.cuda.current_stream(t.device).synchronize()
    return host


def _compress(
    name: str,
    dname: str,
    shape: tuple[int, ...],
    raw_nbytes: int,
    t: torch.Tensor,
    cfg: CodecConfig,
    lossy: dict[str, Any] | None,
) -> EncodedTensor:
    """Entry and buffers for ``t`` (CPU, contiguous: the tensor itself or its reduced form)."""
    nbytes = t.nbytes
    if nbytes == 0:
        return EncodedTensor(name, dname, shape, 0, "none", [], [], t)
    raw = byte_view(t)
    if cfg.codec == "none":
        return EncodedTensor(name, dname, shape, raw_nbytes, "none", [nbytes], [raw], t, lossy)
    blosc2 = load_blosc2()
    cparams = _cparams(blosc2, cfg, t.element_size())
    buffers: list[memoryview | bytes] = []
    for off in range(0, nbytes, CHUNK_BYTES):
        buffers.append(blosc2.compress2(raw[off : off + CHUNK_BYTES], **cparams))
    chunks = [len(b) for b in buffers]
    if sum(chunks) >= nbytes:  # incompressible (or tiny): the raw bytes are cheaper on both ends
        return EncodedTensor(name, dname, shape, raw_nbytes, "none", [nbytes], [raw], t, lossy)
    return EncodedTensor(name, dname, shape, raw_nbytes, cfg.codec, chunks, buffers, None, lossy)


class TensorEntry(NamedTuple):
    """A validated tensor description read from a peer's frame header.

    ``raw_nbytes`` is the size of the tensor as it is restored (its own dtype). For a
    reduced tensor ``codec`` names the whole decoding (``"int8+zstd"``, ``"int4"``: never
    ``"none"``, so readers of raw bytes leave it alone) and ``lossy`` says how; a skipped
    reduction keeps its record in ``lossy`` (method ``"none"``) and its plain codec.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    raw_nbytes: int
    encoded_nbytes: int
    codec: str
    chunks: tuple[int, ...]
    lossy: Lossy | None = None
    param_nbytes: int = 0  # bytes of parameters in the entry's "lossy" object (as EncodedTensor's)

    @property
    def reduced(self) -> bool:
        """True when the payload is a lossy reduction of the tensor."""
        return self.lossy is not None and self.lossy.method != "none"


def parse_entry(d: Any) -> TensorEntry:
    """Validate a peer's tensor description; anything inconsistent is a :class:`ProtocolError`.

    Runs for every received tensor, hence the plain loops and exact type checks (JSON
    gives ``int`` for integers; ``bool`` and ``float`` are refused).
    """
    try:
        name, dtype, shape = d["name"], d["dtype"], d["shape"]
        raw, enc, codec, chunks = d["raw_nbytes"], d["encoded_nbytes"], d["codec"], d["chunks"]
    except (KeyError, TypeError):
        raise ProtocolError(f"tensor entry is incomplete: {str(d)[:200]}") from None
    spec = DTYPES.get(dtype) if type(dtype) is str else None
    if type(name) is not str or spec is None or type(codec) is not str or codec not in _CODEC_SET:
        raise ProtocolError(f"bad tensor entry name/dtype/codec: {name!r} {dtype!r} {codec!r}")
    if type(shape) is not list or len(shape) > MAX_DIMS:
        raise ProtocolError(f"bad shape for tensor {name!r}")
    size = spec[1]
    for dim in shape:
        if type(dim) is not int or not 0 <= dim <= MAX_DIM:
            raise ProtocolError(f"bad shape for tensor {name!r}")
        size *= dim
    if type(raw) is not int or size != raw:
        raise ProtocolError(f"tensor {name!r}: shape {shape} x {dtype} is not {raw!r} bytes")
    lossy = d.get("lossy")
    stored, pbytes = raw, 0
    if lossy is not None:
        checked = parse_lossy(lossy, name, dtype, shape, raw)
        pbytes = param_nbytes(lossy, _ENTRY_JSON)  # what the sender counted; finite once checked
        lossy = checked  # validated: plain numbers and strings
        if lossy.method != "none":
            stored = lossy.nbytes
    if type(chunks) is not list or type(enc) is not int:
        raise ProtocolError(f"bad chunk list for tensor {name!r}")
    total = 0
    for c in chunks:
        if type(c) is not int or c < 0:
            raise ProtocolError(f"bad chunk list for tensor {name!r}")
        total += c
    if total != enc:
        raise ProtocolError(f"bad sizes for tensor {name!r}")
    if codec == "none":
        if enc != stored or len(chunks) != (1 if stored else 0):
            raise ProtocolError(
                f"raw tensor {name!r} declares {enc} bytes on the wire for {stored}"
            )
    elif len(chunks) != -(-stored // CHUNK_BYTES):
        raise ProtocolError(f"tensor {name!r} declares {len(chunks)} chunks for {stored} bytes")
    if lossy is not None and lossy.method != "none":  # the codec names the whole decoding
        label = lossy.method if codec == "none" else f"{lossy.method}+{codec}"
        return TensorEntry(name, dtype, tuple(shape), raw, enc, label, tuple(chunks), lossy,
                           pbytes)
    return TensorEntry(name, dtype, tuple(shape), raw, enc, codec, tuple(chunks), lossy, pbytes)


def decompress_into(entry: TensorEntry, src: memoryview, dst: bytearray, nthreads: int = 1) -> None:
    """Decode ``entry``'s payload (its chunks back to back in ``src``) into ``dst``, which
    holds ``entry.raw_nbytes``: decompress, then restore a reduced tensor.

    Each chunk's own blosc2 header is checked against what the frame declared before any
    byte is written, so a lying peer cannot make us overrun ``dst``. A receiver that has
    not set ``dst`` aside yet calls :func:`decode_new` instead, which checks first.
    """
    if entry.reduced:
        lossy = entry.lossy
        data = _reduced_bytes(entry, src, nthreads)
        restore_into(lossy, entry.name, DTYPES[entry.dtype][0], entry.shape, data, dst)
        return
    _decompress(entry, src, dst, entry.raw_nbytes, nthreads)


def _reduced_bytes(entry: TensorEntry, src: Any, nthreads: int) -> Any:
    """A reduced tensor's bytes as sent: ``src`` itself when they went raw, else
    decompressed into memory of their own once every chunk's header is checked."""
    lossy = entry.lossy
    if entry.codec == lossy.method:  # the reduced bytes went raw
        return src[: lossy.nbytes]
    check_chunks(entry, src, lossy.nbytes)
    data = bytearray(lossy.nbytes)
    _decompress(entry, src, data, lossy.nbytes, nthreads)
    return data


def decode_new(entry: TensorEntry, src: Any, nthreads: int = 1) -> bytearray:
    """The restored bytes of a compressed or reduced tensor, in memory of their own.

    What the peer declared is checked before memory of that size is set aside: every
    chunk's blosc2 header (sizes), then a reduced tensor's own headers (a quantizer's
    scales and zero points, each image's size and mode); only then are the reduced bytes
    and the tensor allocated. A small frame that declares a huge tensor over garbage
    chunks costs nothing but its own bytes.
    """
    src = memoryview(src)
    if entry.reduced:
        lossy = entry.lossy
        data = _reduced_bytes(entry, src, nthreads)
        check_reduced(lossy, entry.name, entry.shape, data)
        out = bytearray(entry.raw_nbytes)
        restore_into(lossy, entry.name, DTYPES[entry.dtype][0], entry.shape, data, out)
        return out
    check_chunks(entry, src, entry.raw_nbytes)
    out = bytearray(entry.raw_nbytes)
    _decompress(entry, src, out, entry.raw_nbytes, nthreads)
    return out


def check_chunks(entry: TensorEntry, src: Any, total: int) -> None:
    """Check every chunk's blosc2 header against the frame's declaration (``total`` bytes
    decompressed, each chunk's length) without decompressing anything."""
    blosc2 = load_blosc2()
    s = d = 0
    for clen in entry.chunks:
        part = src[s : s + clen]
        want = min(CHUNK_BYTES, total - d)
        try:
            nbytes, cbytes, _ = blosc2.get_cbuffer_sizes(part)
        except Exception as exc:  # blosc2 raises several types on garbage
            raise ProtocolError(f"tensor {entry.name!r}: not a blosc2 chunk ({exc})") from None
        if nbytes != want or cbytes != clen:
            raise ProtocolError(
                f"tensor {entry.name!r}: chunk says {nbytes}/{cbytes} bytes, frame said {want}/{clen}"
            )
        s += clen
        d += want


def _decompress(entry: TensorEntry, src: Any, dst: Any, total: int, nthreads: int) -> None:
    blosc2 = load_blosc2()
    check_chunks(entry, src, total)
    s = d = 0
    for clen in entry.chunks:
        part = src[s : s + clen]
        want = min(CHUNK_BYTES, total - d)
        try:
            blosc2.decompress2(part, dst=memoryview(dst)[d : d + want], nthreads=nthreads)
        except Exception as exc:
            raise ProtocolError(f"tensor {entry.name!r}: corrupt blosc2 chunk ({exc})") from None
        s += clen
        d += want


def decode(entry: TensorEntry, payload: Any, nthreads: int = 1) -> torch.Tensor:
    """The tensor that ``entry`` and its payload bytes describe, in its own dtype and shape
    (what a channel does for each received tensor; a new tensor, not a view of ``payload``).

    >>> enc = encode_tensor("x", torch.ones(2, 3), CodecConfig(lossy="int8"))
    >>> decode(parse_entry(enc.entry()), enc.payload()).dtype
    torch.float32
    """
    if entry.raw_nbytes == 0:
        return tensor_from(entry, None)
    if entry.codec == "none":
        return tensor_from(entry, bytearray(payload))
    return tensor_from(entry, decode_new(entry, payload, nthreads))


def tensor_from(entry: TensorEntry, buf: bytearray | None) -> torch.Tensor:
    """A tensor over ``buf`` without copying (``buf`` must hold exactly ``entry.raw_nbytes``)."""
    dtype = DTYPES[entry.dtype][0]
    if entry.raw_nbytes == 0 or buf is None:
        return torch.empty(entry.shape, dtype=dtype)
    flat = torch.frombuffer(buf, dtype=dtype)
    return flat if len(entry.shape) == 1 else flat.view(entry.shape)


def now_ms() -> float:
    """Monotonic clock in milliseconds (the one clock every transport figure is read from)."""
    return time.perf_counter_ns() / 1e6
