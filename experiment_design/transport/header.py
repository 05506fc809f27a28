"""The header fields tracr's own roles read, checked where a frame is received.

A header is JSON the peer chose; the roles read some of its fields as ints, strings or
lists (``int(header["id"])`` in a thread that must not die). Every such field is checked
here, by type and range, before :meth:`DataChannel.recv` returns the header: a field of
the wrong type is a :class:`ProtocolError` that closes the channel, and whoever waits on
that channel ends with the message instead of waiting for a reply that will never be
matched. JSON's ``NaN`` and ``Infinity`` literals are refused by the frame parser
before this runs (a non-finite float crosses only in the tagged form of ``plain.py``).

Fields not named here are the caller's own (a user's role may add any): they are plain
JSON already, and the caller checks what it reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from experiment_design.transport.errors import ProtocolError

_INT64 = 1 << 63
MAX_NAME = 256  # characters of an op, an instance name, an error's first line
MAX_ROUTE = 256  # stages in a route (and records in a reply)
MAX_TEXT = 1 << 16  # characters of an error message


def _int(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: type(v) is int and lo <= v <= hi


def _number(v: Any) -> bool:
    return (type(v) is int and -_INT64 <= v < _INT64) or type(v) is float  # finite: parser


def _number_or_none(v: Any) -> bool:
    return v is None or _number(v)


def _text(limit: int) -> Callable[[Any], bool]:
    return lambda v: type(v) is str and len(v) <= limit


def _list_of(check: Callable[[Any], bool], limit: int) -> Callable[[Any], bool]:
    return lambda v: type(v) is list and len(v) <= limit and all(check(x) for x in v)


_name = _text(MAX_NAME)
_id = _int(-_INT64, _INT64 - 1)
_hop = _int(0, MAX_ROUTE)
_cut = _int(0, 1 << 20)


def _layer(v: Any) -> bool:
    """One ``[layer index, ms]`` pair of a stage's timings."""
    return type(v) is list and len(v) == 2 and _cut(v[0]) and _number(v[1])


_layers = _list_of(_layer, 1 << 20)


def _record(v: Any) -> bool:
    """A stage's record in a reply: the fields the head reads back from it."""
    if type(v) is not dict:
        return False
    for key, value in v.items():
        check = _RECORD.get(key)
        if check is not None and not check(value):
            return False
    return True


#: a stage record's fields that the head reads as a given type
_RECORD: dict[str, Callable[[Any], bool]] = {
    "instance": _name,
    "hop": _hop,
    "a": _cut,
    "b": _cut,
    "layers": _layers,
}

#: header field -> (its check, what it must be: said in the error)
FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "op": (_name, f"a string of at most {MAX_NAME} characters"),
    "id": (_id, "a 64-bit integer"),
    "head": (_name, "an instance name"),
    "hop": (_hop, f"an integer 0-{MAX_ROUTE}"),
    "split": (_cut, "a cut index (a non-negative integer)"),
    "route": (_list_of(_name, MAX_ROUTE), f"a list of at most {MAX_ROUTE} instance names"),
    "cuts": (_list_of(_cut, MAX_ROUTE), "a list of cut indices"),
    "pipe": (lambda v: type(v) is bool, "true or false"),
    "count": (_int(1, 1 << 20), "an integer 1-1048576"),
    "done": (_int(0, 1 << 20), "an integer 0-1048576"),
    "progress_s": (lambda v: _number(v) and 0 < v <= 86400, "a number of seconds, 0-86400"),
    "stages": (_list_of(_record, MAX_ROUTE), "a list of stage records"),
    "layers": (_layers, "a list of [layer, ms] pairs"),
    "error": (_text(MAX_TEXT), "a string"),
    "message": (_text(MAX_TEXT), "a string"),
    "cpu_ms": (_number_or_none, "a number"),
    "decode_ms": (_number_or_none, "a number"),
    "compute_ms": (_number_or_none, "a number"),
    "recv_ms": (_number_or_none, "a number"),
    "throughput_per_s": (_number_or_none, "a number"),
    "latency_ms_p50": (_number_or_none, "a number"),
}


def check_header(header: dict[str, Any]) -> None:
    """Refuse a received header whose known fields have the wrong type or range."""
    for key, value in header.items():
        spec = FIELDS.get(key)
        if spec is not None and not spec[0](value):
            raise ProtocolError(
                f"frame header field {key!r} must be {spec[1]}, got {str(value)[:60]!r}"
            )
