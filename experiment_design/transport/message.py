"""A message's values laid out for a frame, before any byte is written or after all are read.

A message is a JSON header and named values. Tensors travel in the payload; plain values
(ints, sizes, None, ...: ``plain.py``) cross in the header under :data:`PLAIN_KEY`, in
their tagged JSON form, never pickled. A message of small, CPU, contiguous tensors that go
raw takes a fast path (:func:`small_raw`): a cached table and the tensors' numpy buffers.
"""

from __future__ import annotations

from typing import Any

import torch

from experiment_design.errors import TracrError
from experiment_design.transport.errors import ProtocolError
from experiment_design.transport.frame import Limits, small_raw_table
from experiment_design.transport.plain import NotPlain, decode_plain, encode_plain

#: the header key under which plain (non-tensor) values cross, name -> tagged JSON
PLAIN_KEY = "__plain__"
#: below this many payload bytes, a message of raw tensors takes the fast path (and its
#: header and payload leave in one write: one segment with NODELAY)
COALESCE = 64 * 1024
_Tensor = torch.Tensor


def with_plain(
    header: dict[str, Any], values: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(header, tensors): the non-tensor values of ``values`` moved into the header, in
    their tagged JSON form (``plain.py``); a value that is neither is a TracrError."""
    tensors: dict[str, Any] = {}
    plain: dict[str, Any] = {}
    for name, v in values.items():
        if isinstance(v, _Tensor):
            tensors[name] = v
        else:
            plain[name] = v
    if not plain:
        return header, values
    if PLAIN_KEY in header:
        raise TracrError(f"header key {PLAIN_KEY!r} is reserved for plain values")
    for name, v in plain.items():
        try:
            plain[name] = encode_plain(v)
        except NotPlain as exc:
            raise NotPlain(
                f"'{name}' cannot cross the data path: {exc.message}",
                hint="tensors and plain data (None, bool, int, float, str, torch.Size, "
                "tuples, lists and str-keyed dicts of them) cross; nothing is pickled",
            ) from None
    return {**header, PLAIN_KEY: {"d": plain}}, tensors


def take_plain(
    header: dict[str, Any], tensors: dict[str, torch.Tensor], limits: Limits
) -> None:
    """Move the plain values a peer sent in ``header`` into ``tensors``, checked."""
    plain = decode_plain(header.pop(PLAIN_KEY), limits.max_plain_items)
    if type(plain) is not dict:
        raise ProtocolError("frame's plain values are not a dict")
    for name, v in plain.items():
        if name in tensors:
            raise ProtocolError(f"frame carries {name!r} both as a tensor and a plain value")
        tensors[name] = v


def small_raw(tensors: dict[str, torch.Tensor]) -> tuple[bytes, int, int, list[Any]] | None:
    """(table, buffer count, payload bytes, buffers) when every tensor can go raw as it is
    and the payload is small; None sends the message down the general path."""
    key = []
    buffers = []
    payload = 0
    for name, t in tensors.items():
        if type(t) is not _Tensor and not isinstance(t, _Tensor):
            return None
        try:
            # numpy() refuses what cannot go as it is (grad, accelerator, bfloat16, conj)
            arr = t.numpy()
        except (TypeError, RuntimeError):
            return None
        n = arr.nbytes
        if not n or not arr.flags.c_contiguous:
            return None
        payload += n
        if payload > COALESCE:
            return None
        key.append((name, arr.dtype, arr.shape))
        buffers.append(arr)
    table, nbuf = small_raw_table(tuple(key))
    return table, nbuf, payload, buffers
