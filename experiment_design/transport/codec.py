"""How a tensor becomes bytes on the wire and back: raw buffers or blosc2 chunks, never pickle.

A tensor crosses as its plain memory (contiguous, on the CPU) plus a JSON description
(name, dtype, shape, sizes, codec). With a codec other than ``"none"`` the memory is
compressed with ``blosc2.compress2`` in chunks of at most :data:`CHUNK_BYTES` (blosc2
cannot take 2 GiB or more in one call), with ``typesize`` set to the element size so the
shuffle filters group bytes of equal significance. blosc2 is imported only when a codec
needs it, so a device without blosc2 can still send and receive raw tensors.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import torch

from experiment_design.constants import CODECS, FILTERS
from experiment_design.errors import TracrError, UnknownNameError
from experiment_design.transport.errors import ProtocolError

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


@dataclass(frozen=True)
class CodecConfig:
    """How the sender encodes crossing tensors (the manifest's ``transport`` section).

    ``codec`` is one of :data:`CODECS` (``"none"`` sends raw bytes), ``filter`` one of
    :data:`FILTERS`, ``level`` 0-9 (0 = store), ``nthreads`` the blosc2 threads per call
    (1 by default: participants are thread-limited and their cores belong to the model).
    ``encrypt`` encrypts every frame (AES-256-GCM) on channels opened with this config;
    every frame carries an integrity tag either way. Both ends must agree on it.

    >>> CodecConfig.from_dict({"codec": "lz4", "level": 5}).to_dict()
    {'codec': 'lz4', 'level': 5, 'filter': 'shuffle', 'nthreads': 1, 'encrypt': False}
    """

    codec: str = "zstd"
    level: int = 1
    filter: str = "shuffle"
    nthreads: int = 1
    encrypt: bool = False

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise UnknownNameError("codec", str(self.codec), CODECS)
        if self.filter not in FILTERS:
            raise UnknownNameError("filter", str(self.filter), FILTERS)
        if (
            not isinstance(self.level, int)
            or isinstance(self.level, bool)
            or not 0 <= self.level <= 9
        ):
            raise TracrError(
                f"transport level must be an integer 0-9, got {self.level!r}",
                hint="0 stores without compressing, 1 is fast, 9 is the strongest",
            )
        if not isinstance(self.nthreads, int) or self.nthreads < 1:
            raise TracrError(
                f"transport nthreads must be a positive integer, got {self.nthreads!r}"
            )
        if not isinstance(self.encrypt, bool):
            raise TracrError(f"transport encrypt must be true or false, got {self.encrypt!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> CodecConfig:
        """Build from a manifest dict; missing keys take the defaults, unknown keys are errors."""
        d = dict(d or {})
        known = {"codec", "level", "filter", "nthreads", "encrypt"}
        extra = sorted(set(d) - known)
        if extra:
            raise TracrError(
                f"unknown transport setting(s) {extra}",
                hint=f"valid settings are {sorted(known)}",
            )
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON view (what the results store records)."""
        return asdict(self)

    @property
    def compresses(self) -> bool:
        """True when tensors go through blosc2."""
        return self.codec != "none"


RAW = CodecConfig(codec="none", level=0, filter="none")


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

    @property
    def encoded_nbytes(self) -> int:
        """Bytes this tensor puts on the wire (payload only)."""
        return sum(self.chunks)

    def entry(self) -> dict[str, Any]:
        """The tensor's description in the frame header."""
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "raw_nbytes": self.raw_nbytes,
            "encoded_nbytes": self.encoded_nbytes,
            "codec": self.codec,
            "chunks": self.chunks,
        }


def encode_tensor(name: str, tensor: torch.Tensor, cfg: CodecConfig) -> EncodedTensor:
    """Encode one tensor: move it to the CPU, make it contiguous, compress if ``cfg`` says so.

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
    if not t.is_cpu:
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    nbytes = t.nbytes
    shape = tuple(t.shape)
    if nbytes == 0:
        return EncodedTensor(name, dname, shape, 0, "none", [], [], t)
    raw = byte_view(t)
    if not cfg.compresses:
        return EncodedTensor(name, dname, shape, nbytes, "none", [nbytes], [raw], t)
    blosc2 = load_blosc2()
    cparams = _cparams(blosc2, cfg, DTYPES[dname][1])
    buffers: list[memoryview | bytes] = []
    for off in range(0, nbytes, CHUNK_BYTES):
        buffers.append(blosc2.compress2(raw[off : off + CHUNK_BYTES], **cparams))
    chunks = [len(b) for b in buffers]
    if sum(chunks) >= nbytes:  # incompressible (or tiny): the raw bytes are cheaper on both ends
        return EncodedTensor(name, dname, shape, nbytes, "none", [nbytes], [raw], t)
    return EncodedTensor(name, dname, shape, nbytes, cfg.codec, chunks, buffers)


class TensorEntry(NamedTuple):
    """A validated tensor description read from a peer's frame header."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    raw_nbytes: int
    encoded_nbytes: int
    codec: str
    chunks: tuple[int, ...]


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
        if enc != raw or len(chunks) != (1 if raw else 0):
            raise ProtocolError(f"raw tensor {name!r} declares {enc} bytes on the wire for {raw}")
    elif len(chunks) != -(-raw // CHUNK_BYTES):
        raise ProtocolError(f"tensor {name!r} declares {len(chunks)} chunks for {raw} bytes")
    return TensorEntry(name, dtype, tuple(shape), raw, enc, codec, tuple(chunks))


def decompress_into(entry: TensorEntry, src: memoryview, dst: bytearray, nthreads: int = 1) -> None:
    """Decompress ``entry``'s chunks (laid out back to back in ``src``) into ``dst``.

    Each chunk's own blosc2 header is checked against what the frame declared before any
    byte is written, so a lying peer cannot make us overrun ``dst``.
    """
    blosc2 = load_blosc2()
    s = d = 0
    for clen in entry.chunks:
        part = src[s : s + clen]
        want = min(CHUNK_BYTES, entry.raw_nbytes - d)
        try:
            nbytes, cbytes, _ = blosc2.get_cbuffer_sizes(part)
        except Exception as exc:  # blosc2 raises several types on garbage
            raise ProtocolError(f"tensor {entry.name!r}: not a blosc2 chunk ({exc})") from None
        if nbytes != want or cbytes != clen:
            raise ProtocolError(
                f"tensor {entry.name!r}: chunk says {nbytes}/{cbytes} bytes, frame said {want}/{clen}"
            )
        try:
            blosc2.decompress2(part, dst=memoryview(dst)[d : d + want], nthreads=nthreads)
        except Exception as exc:
            raise ProtocolError(f"tensor {entry.name!r}: corrupt blosc2 chunk ({exc})") from None
        s += clen
        d += want


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
