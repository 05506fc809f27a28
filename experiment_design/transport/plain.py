"""Plain data: the non-tensor values that may cross a cut, and their tagged JSON form.

A model that computes shapes (``x.size()``, ``x.shape[0] // 2``, a ``None`` from an
assert) hands such values from one layer to a later one, so they cross cuts beside the
tensors. They travel in the frame's JSON header, never pickled, each restored with its
exact Python type::

    None, bool, int, str     themselves
    float                    itself; nan, inf, -inf as {"f": "nan" | "inf" | "-inf"}
    list                     a JSON array of encoded items
    tuple                    {"t": [...]}
    torch.Size               {"s": [int, ...]}
    dict (str keys)          {"d": {key: encoded, ...}}
    torch.dtype              {"dtype": "float32"}
    torch.device             {"device": "cuda:0"}

Only exact types count (a subclass of int or tuple is not plain: its type could not be
restored). :func:`is_plain` is the one rule both split engines use to classify a value,
and :func:`decode_plain` builds nothing but the values above, within
:data:`MAX_DEPTH` levels and a caller's item limit; anything else is a
:class:`ProtocolError`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import torch

from experiment_design.errors import TracrError
from experiment_design.transport.errors import ProtocolError

#: nesting levels a plain value may have (a list in a tuple is two)
MAX_DEPTH = 32
#: items (every value, nested ones included) one decoded message may hold by default
MAX_ITEMS = 65536

_INT64 = 1 << 63
_SCALARS = (type(None), bool, int, str)
_SPECIAL = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_DTYPES = {
    str(dt).removeprefix("torch."): dt
    for dt in vars(torch).values()
    if isinstance(dt, torch.dtype)
}
_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
_DEVICE = re.compile(r"(cpu|cuda|mps|xpu|meta)(:[0-9]{1,4})?")


class NotPlain(TracrError):
    """A value that is neither a tensor nor plain data was to cross a cut."""


def encode_plain(value: Any, depth: int = 0) -> Any:
    """The tagged JSON form of a plain value; anything else is a :class:`NotPlain`."""
    if depth > MAX_DEPTH:
        raise NotPlain(f"plain value nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is float:
        if math.isfinite(value):
            return value
        return {"f": "nan" if value != value else ("inf" if value > 0 else "-inf")}
    if kind is list:
        return [encode_plain(v, depth + 1) for v in value]
    if kind is tuple:
        return {"t": [encode_plain(v, depth + 1) for v in value]}
    if kind is torch.Size:
        return {"s": list(value)}
    if kind is dict:
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                raise NotPlain(f"a dict with a {type(k).__name__} key is not plain data")
            out[k] = encode_plain(v, depth + 1)
        return {"d": out}
    if kind is torch.dtype:
        return {"dtype": str(value).removeprefix("torch.")}
    if kind is torch.device:
        return {"device": str(value)}
    raise NotPlain(f"a {kind.__name__} is neither a tensor nor plain data")


def is_plain(value: Any) -> bool:
    """True for plain data: what :func:`encode_plain` accepts."""
    try:
        encode_plain(value)
    except NotPlain:
        return False
    return True


def plain_nbytes(value: Any) -> int:
    """Bytes of a plain value's encoded form (what it adds to a frame header, about)."""
    return len(_ENCODE(encode_plain(value)))


def decode_plain(obj: Any, max_items: int = MAX_ITEMS) -> Any:
    """The plain value that ``obj`` (decoded JSON from a peer) encodes.

    Strict: an unknown tag, a tag with more keys or the wrong kind of content, nesting
    beyond :data:`MAX_DEPTH` or more than ``max_items`` values is a :class:`ProtocolError`.
    """
    budget = [max_items]
    return _decode(obj, 0, budget)


def _decode(obj: Any, depth: int, budget: list[int]) -> Any:
    if depth > MAX_DEPTH:
        raise ProtocolError(f"plain value nested deeper than {MAX_DEPTH} levels")
    budget[0] -= 1
    if budget[0] < 0:
        raise ProtocolError("plain values hold too many items")
    kind = type(obj)
    if kind in _SCALARS or kind is float:
        # JSON's own nan/inf literals are not our encoding
        if kind is float and not math.isfinite(obj):
            raise ProtocolError("plain float not in tagged form")
        return obj
    if kind is list:
        return [_decode(v, depth + 1, budget) for v in obj]
    if kind is not dict or len(obj) != 1:
        raise ProtocolError(f"bad plain value of JSON type {kind.__name__}")
    ((tag, body),) = obj.items()
    if tag == "t" and type(body) is list:
        return tuple(_decode(v, depth + 1, budget) for v in body)
    if tag == "s" and type(body) is list:
        budget[0] -= len(body)
        if budget[0] < 0:
            raise ProtocolError("plain values hold too many items")
        if not all(type(d) is int and -_INT64 <= d < _INT64 for d in body):
            raise ProtocolError("bad torch.Size in plain value")
        return torch.Size(body)
    if tag == "d" and type(body) is dict:
        return {k: _decode(v, depth + 1, budget) for k, v in body.items()}
    if tag == "f" and type(body) is str and body in _SPECIAL:
        return _SPECIAL[body]
    if tag == "dtype" and type(body) is str and body in _DTYPES:
        return _DTYPES[body]
    if tag == "device" and type(body) is str and _DEVICE.fullmatch(body):
        return torch.device(body)
    raise ProtocolError(f"bad plain value: unknown tag or content {tag!r}")
