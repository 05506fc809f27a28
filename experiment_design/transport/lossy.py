"""Lossy reductions of crossing tensors, described in the tensor's own table entry.

A reduction turns a floating tensor into fewer bytes before the lossless codec sees them;
the entry's ``"lossy"`` object says what was done, so the receiver restores the tensor's
dtype and shape from the entry alone, whatever its own configuration::

    {"method": "float16"}  {"method": "bfloat16"}              a cast
    {"method": "int8"}                                         affine: x = (q - z) * s
    {"method": "int4", "channels": 64}                         the same, 4 bits, two a byte
    {"method": "jpeg", "quality": 90, "scale": [...],          one image per batch item,
     "offset": [...], "sizes": [...]}                          x = pixel * scale + offset
    {"method": "none", "wanted": "int8", "why": "non-finite"}  asked for, not applied

int8/int4 parameters are one scale and zero point (per tensor) or one per channel
(``channels``: dim 1 of a tensor of 3 or more dimensions; a 2-D (N, F) tensor goes per
tensor). They lead the reduced bytes, in binary: the scales as little-endian float32,
then the zero points as one byte each, then the quantized values (5 bytes per tensor or
channel: as JSON in the table they took 40-60, which kept int8 of resnet18's 512 pooled
features at 3.61x fewer bytes than float32). Their range always holds 0 (as PyTorch's
observers do), so a zero point is an integer in 0..qmax, a zero is sent exactly and every
value is restored within ``scale / 2``; an all-zero tensor or channel has scale 0. int4
packs the first of each pair in the low nibble; an odd count is padded with one nibble.
jpeg/webp map each channel of an ``(N, C, H, W)`` batch with C in (1, 3) (a model's
input: the compressed-input baseline) onto 0..255 and encode each item with Pillow.

Quantizers and images refuse tensors holding inf or nan (the tensor crosses losslessly
and its entry says why); the casts keep them, except that float16 refuses finite values
beyond its range. A method that would not shrink the tensor is not applied either.
"""

from __future__ import annotations

import io
import math
from typing import Any, NamedTuple

import numpy as np
import torch

from experiment_design.constants import LOSSY
from experiment_design.transport.errors import ProtocolError

#: Per-channel parameters for more channels than this go per tensor (they ride in the table).
MAX_CHANNELS = 4096
#: Why a reduction that was asked for was not applied (the ``why`` of a ``"none"`` record).
WHY = ("non-finite", "out of range", "not an image", "no gain")
QMAX = {"int8": 255, "int4": 15}
_CASTS = {"float16": torch.float16, "bfloat16": torch.bfloat16}
_FLOATS = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}
_IMAGE = {"jpeg": ("JPEG", 65500), "webp": ("WEBP", 16383)}  # Pillow format, largest side
_KEYS = {
    "none": {"method", "wanted", "why"},
    "float16": {"method"},
    "bfloat16": {"method"},
    "int8": {"method", "channels"},
    "int4": {"method", "channels"},
    "jpeg": {"method", "quality", "scale", "offset", "sizes"},
    "webp": {"method", "quality", "scale", "offset", "sizes"},
}


class Lossy(NamedTuple):
    """A validated ``"lossy"`` object of a peer's tensor entry."""

    method: str  # "none": asked for and not applied (``why`` says why)
    nbytes: int  # bytes of the reduced form, before the lossless codec
    scale: tuple[float, ...] = ()  # jpeg/webp (int8/int4 carry theirs in the reduced bytes)
    zero: tuple[float, ...] = ()  # offsets (jpeg/webp)
    sizes: tuple[int, ...] = ()  # bytes of each image (jpeg/webp)
    why: str = ""
    channels: int = 1  # int8/int4: scales and zero points leading the reduced bytes


#: Bytes of one scale (float32) and one zero point (uint8) before a quantized tensor's values.
PARAM_BYTES = 5


def param_nbytes(lossy: dict[str, Any] | None, encode: Any) -> int:
    """Bytes a reduction's parameters add to the table (``encode``: the table's JSON
    encoder): the object beyond naming its method, which is framing like a dtype or a
    codec. An image's scales, offsets and sizes; a per-channel quantizer's channel count
    (its scales and zero points ride in the payload); nothing for a cast or a skip."""
    if lossy is None or lossy.get("method") == "none":
        return 0
    return len(encode(lossy)) - len(encode({"method": lossy["method"]}))


def quant_params(data: Any, channels: int, qmax: int, name: str = "x") -> tuple[Any, Any]:
    """The scales (float32) and zero points (uint8) leading a quantized tensor's reduced
    bytes, checked: finite, non-negative scales and zero points within 0..``qmax``."""
    if len(data) < PARAM_BYTES * channels:
        raise ProtocolError(f"tensor {name!r}: reduced bytes shorter than their parameters")
    scale = np.frombuffer(data, "<f4", channels, 0).astype(np.float32)
    zero = np.frombuffer(data, np.uint8, channels, 4 * channels)
    if not (np.isfinite(scale).all() and (scale >= 0).all()):
        raise ProtocolError(f"tensor {name!r}: a scale is negative or not finite")
    if (zero > qmax).any():
        raise ProtocolError(f"tensor {name!r}: zero points must be integers 0-{qmax}")
    return scale, zero


def _floats(t: torch.Tensor) -> list[float]:
    """float32 values as the shortest decimals that read back as the same float32 (a
    float32 printed as a float64 takes twice the characters in the table)."""
    return [float(str(v)) for v in t.detach().cpu().float().numpy()]


def _skip(method: str, why: str) -> tuple[None, dict[str, Any]]:
    return None, {"method": "none", "wanted": method, "why": why}


def reduce(
    t: torch.Tensor, method: str, granularity: str = "tensor", quality: int = 90
) -> tuple[torch.Tensor | None, dict[str, Any]]:
    """Reduce floating tensor ``t`` (any device, not empty) with ``method``.

    Returns the reduced form (a contiguous CPU tensor whose bytes are sent) and the
    entry's ``"lossy"`` object; the form is None where the method was not applied.
    """
    if method in _CASTS:
        if t.element_size() <= 2:
            return _skip(method, "no gain")
        h = t.to(_CASTS[method])
        if method == "float16":
            bad = ~torch.isfinite(h)
            if bad.any() and (bad & torch.isfinite(t)).any():
                return _skip(method, "out of range")
        return h.cpu().contiguous(), {"method": method}
    if method in QMAX:
        return _quantize(t, method, granularity)
    if method in _IMAGE:
        return _images(t, method, quality)
    raise ValueError(f"unknown lossy method {method!r}")  # CodecConfig checked it


def _channel_view(t: torch.Tensor, n: int) -> tuple[int, ...]:
    """The shape that broadcasts one value per channel (dim 1) over ``t``."""
    return (1, n) + (1,) * (t.dim() - 2)


def _quantize(t: torch.Tensor, method: str, granularity: str):
    qmax = QMAX[method]
    x = t if t.dtype in (torch.float32, torch.float64) else t.float()
    # Channels are dim 1 of a tensor with extent beyond it (N, C, H, W) or (N, C, L): in an
    # (N, F) matrix each "channel" is one value, and a scale per value would outweigh it.
    per_channel = granularity == "channel" and x.dim() >= 3 and 1 < x.shape[1] <= MAX_CHANNELS
    if per_channel:
        dims = [d for d in range(x.dim()) if d != 1]
        lo, hi = x.amin(dim=dims), x.amax(dim=dims)
    else:
        lo, hi = torch.aminmax(x)
        lo, hi = lo.reshape(1), hi.reshape(1)
    if not (torch.isfinite(lo).all() and torch.isfinite(hi).all()):
        return _skip(method, "non-finite")
    lo = lo.float().clamp(max=0)
    hi = hi.float().clamp(min=0)
    scale = (hi - lo) / qmax  # float32: the very values the receiver multiplies by
    zero = (-lo / scale).round().nan_to_num(0.0).clamp(0, qmax)  # 0/0 for an all-zero channel
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    if per_channel:
        shape = _channel_view(x, len(scale))
        q = x / safe.view(shape).to(x.dtype)
        q = q.round_().add_(zero.view(shape).to(x.dtype))
    else:
        q = (x / safe.to(x.dtype)).round_().add_(zero.to(x.dtype))
    q = q.clamp_(0, qmax).to(torch.uint8).cpu().reshape(-1)
    if method == "int4":
        if q.numel() % 2:
            q = torch.cat([q, q.new_zeros(1)])
        q = q[0::2] | (q[1::2] << 4)
    n = len(scale)
    if PARAM_BYTES * n + q.numel() >= x.numel() * t.element_size():
        return _skip(method, "no gain")  # e.g. one float32 value: 5 + 1 bytes for 4
    head = np.empty(PARAM_BYTES * n, np.uint8)
    head[: 4 * n] = scale.cpu().numpy().astype("<f4").view(np.uint8)
    head[4 * n :] = zero.cpu().numpy().astype(np.uint8)
    params: dict[str, Any] = {"method": method}
    if per_channel:
        params["channels"] = n
    return torch.cat([torch.from_numpy(head), q]), params


def _images(t: torch.Tensor, method: str, quality: int):
    fmt, largest = _IMAGE[method]
    if t.dim() != 4 or t.shape[1] not in (1, 3) or max(t.shape[2], t.shape[3]) > largest:
        return _skip(method, "not an image")
    n, c = t.shape[0], t.shape[1]
    x = t.float()
    lo, hi = x.amin(dim=(0, 2, 3)), x.amax(dim=(0, 2, 3))
    if not (torch.isfinite(lo).all() and torch.isfinite(hi).all()):
        return _skip(method, "non-finite")
    scale = (hi - lo) / 255
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    pix = ((x - lo.view(1, c, 1, 1)) / safe.view(1, c, 1, 1)).round_().clamp_(0, 255)
    pix = pix.to(torch.uint8).permute(0, 2, 3, 1).cpu().contiguous().numpy()
    from PIL import Image

    blobs = []
    for i in range(n):
        out = io.BytesIO()
        Image.fromarray(pix[i] if c == 3 else pix[i, :, :, 0]).save(
            out, format=fmt, quality=int(quality)
        )
        blobs.append(out.getvalue())
    data = b"".join(blobs)
    if len(data) >= t.numel() * t.element_size():
        return _skip(method, "no gain")
    params = {
        "method": method,
        "quality": int(quality),
        "scale": _floats(scale),
        "offset": _floats(lo),
        "sizes": [len(b) for b in blobs],
    }
    return torch.frombuffer(bytearray(data), dtype=torch.uint8), params


# -- the receiving side ----------------------------------------------------------------------
def _numbers(v: Any, n: int, what: str, name: str, *, low: float | None = None) -> tuple:
    if type(v) is not list or len(v) != n:
        raise ProtocolError(f"tensor {name!r}: {what} must be a list of {n}")
    for x in v:
        if type(x) not in (int, float) or not math.isfinite(x) or (low is not None and x < low):
            raise ProtocolError(f"tensor {name!r}: bad {what} value {str(x)[:40]}")
    return tuple(v)


def parse_lossy(d: Any, name: str, dtype: str, shape: list[int], raw: int) -> Lossy:
    """Validate a peer's ``"lossy"`` object for a tensor of ``dtype``, ``shape``, ``raw`` bytes.

    The reduced size it implies never exceeds ``raw``, which the frame's limits bound, and
    its lists are as long as the tensor has channels or batch items.
    """
    method = d.get("method") if type(d) is dict else None
    if type(method) is not str or method not in LOSSY:
        raise ProtocolError(f"tensor {name!r}: bad lossy method {str(method)[:40]!r}")
    extra = set(d) - _KEYS[method]
    if extra:
        raise ProtocolError(f"tensor {name!r}: unknown lossy keys {sorted(extra)[:4]}")
    if method == "none":
        wanted, why = d.get("wanted"), d.get("why")
        if wanted not in LOSSY or wanted == "none" or why not in WHY:
            raise ProtocolError(f"tensor {name!r}: bad record of a skipped reduction")
        return Lossy("none", raw, why=why)
    size = _FLOATS.get(dtype)
    if size is None or raw == 0:
        raise ProtocolError(f"tensor {name!r}: {method} applies to non-empty floating tensors")
    numel = raw // size
    if method in _CASTS:
        if size <= 2:
            raise ProtocolError(f"tensor {name!r}: {method} of a {dtype} tensor")
        return Lossy(method, numel * 2)
    if method in QMAX:
        channels = d.get("channels", 1)
        if type(channels) is not int or channels < 1 or (
            channels != 1 and not (len(shape) >= 3 and channels == shape[1] <= MAX_CHANNELS)
        ):
            raise ProtocolError(
                f"tensor {name!r}: {str(channels)[:20]} channels for shape {shape}"
                " (1, or one per channel of dim 1 of a tensor of 3 or more dimensions)"
            )
        nbytes = PARAM_BYTES * channels + (numel if method == "int8" else (numel + 1) // 2)
        if nbytes >= raw:
            raise ProtocolError(f"tensor {name!r}: {method} of {raw} bytes takes {nbytes}")
        return Lossy(method, nbytes, channels=channels)
    # jpeg / webp
    _, largest = _IMAGE[method]
    if len(shape) != 4 or shape[1] not in (1, 3) or not 1 <= max(shape[2:]) <= largest:
        raise ProtocolError(f"tensor {name!r}: {method} needs an image batch, not {shape}")
    quality = d.get("quality")
    if type(quality) is not int or not 1 <= quality <= 100:
        raise ProtocolError(f"tensor {name!r}: bad {method} quality {str(quality)[:20]}")
    scale = _numbers(d.get("scale"), shape[1], "scale", name, low=0)
    offset = _numbers(d.get("offset"), shape[1], "offset", name)
    sizes = _numbers(d.get("sizes"), shape[0], "sizes", name, low=1)
    if any(type(s) is not int for s in sizes) or sum(sizes) >= raw:
        raise ProtocolError(f"tensor {name!r}: bad {method} image sizes")
    return Lossy(method, sum(sizes), scale, offset, sizes)


def check_reduced(lossy: Lossy, name: str, shape: tuple[int, ...], data: Any) -> None:
    """Check a reduced tensor's own headers before memory of the tensor's size is set
    aside: a quantizer's scales and zero points, each image's size and mode (read from
    its header, nothing decoded)."""
    method = lossy.method
    if method in QMAX:
        quant_params(np.frombuffer(data, np.uint8), lossy.channels, QMAX[method], name)
    elif method in _IMAGE:
        from PIL import Image

        fmt, _ = _IMAGE[method]
        _, c, h, w = shape
        mode = "RGB" if c == 3 else "L"
        modes = (mode, "RGB") if method == "webp" else (mode,)
        view = memoryview(data)
        pos = 0
        for i, size in enumerate(lossy.sizes):
            try:
                with Image.open(io.BytesIO(view[pos : pos + size]), formats=[fmt]) as img:
                    ok = img.size == (w, h) and img.mode in modes
                    got = f"{img.mode} {img.size[0]}x{img.size[1]}"
            except Exception as exc:  # Pillow raises many types on garbage
                raise ProtocolError(f"tensor {name!r}: image {i} does not decode ({exc})") from None
            if not ok:
                raise ProtocolError(
                    f"tensor {name!r}: image {i} is {got}, the entry says {mode} {w}x{h}"
                )
            pos += size


def restore_into(
    lossy: Lossy, name: str, dtype: torch.dtype, shape: tuple[int, ...], data: Any, out: Any
) -> None:
    """Restore a reduced tensor from its bytes ``data`` (exactly ``lossy.nbytes``) into
    ``out`` (writable memory of the original tensor's size)."""
    dst = torch.frombuffer(out, dtype=dtype).view(shape)
    arr = np.frombuffer(data, np.uint8)
    if not arr.flags.writeable or arr.ctypes.data % 8:  # torch wants writable, aligned memory
        arr = arr.copy()
    q = torch.from_numpy(arr)
    method = lossy.method
    if method in _CASTS:
        dst.copy_(q.view(_CASTS[method]).view(shape))
    elif method in QMAX:
        n = lossy.channels
        scales, zeros = quant_params(arr, n, QMAX[method], name)
        q = q[PARAM_BYTES * n :]
        numel = dst.numel()
        if method == "int4":
            q = torch.stack([q & 0x0F, q >> 4], dim=1).reshape(-1)[:numel]
        x = q.to(torch.float32).view(shape)
        if n == 1:
            scale: Any = torch.tensor(float(scales[0]), dtype=torch.float32)
            zero: Any = int(zeros[0])
        else:
            view = _channel_view(x, n)
            scale = torch.from_numpy(scales).view(view)
            zero = torch.from_numpy(zeros.astype(np.float32)).view(view)
        dst.copy_(x.sub_(zero).mul_(scale))
    else:
        _restore_images(lossy, name, shape, data, dst)


def _restore_images(lossy: Lossy, name: str, shape: tuple[int, ...], data: Any, dst) -> None:
    from PIL import Image

    fmt, _ = _IMAGE[lossy.method]
    n, c, h, w = shape
    mode = "RGB" if c == 3 else "L"
    modes = (mode, "RGB") if lossy.method == "webp" else (mode,)  # WebP stores grey as RGB
    scale = torch.tensor(lossy.scale, dtype=torch.float32).view(c, 1, 1)
    offset = torch.tensor(lossy.zero, dtype=torch.float32).view(c, 1, 1)
    view = memoryview(data)
    pos = 0
    for i, size in enumerate(lossy.sizes):
        try:
            with Image.open(io.BytesIO(view[pos : pos + size]), formats=[fmt]) as img:
                if img.size != (w, h) or img.mode not in modes:  # checked before decoding
                    raise ProtocolError(
                        f"tensor {name!r}: image {i} is {img.mode} {img.size[0]}x{img.size[1]},"
                        f" the entry says {mode} {w}x{h}"
                    )
                pix = np.asarray(img if img.mode == mode else img.convert(mode))
        except ProtocolError:
            raise
        except Exception as exc:  # Pillow raises many types on garbage
            raise ProtocolError(f"tensor {name!r}: image {i} does not decode ({exc})") from None
        p = torch.from_numpy(pix.copy()).view(h, w, c).permute(2, 0, 1)
        dst[i].copy_(p.to(torch.float32).mul_(scale).add_(offset))
        pos += size
