"""The wire: the ready line, the heartbeat, and the JSON form of every control message."""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from experiment_design.errors import TracrError

#: ``python -m <PARTICIPANT_MODULE> --role NAME ...`` starts a participant process.
PARTICIPANT_MODULE = "experiment_design.participant"
READY_PREFIX = "TRACR-READY "
#: The heartbeat line, written both ways over the participant's stdio (not rpyc: a call in
#: progress, or a partner profiling for minutes, must not starve it).
ALIVE_LINE = "TRACR-ALIVE"
#: Seconds between two heartbeats; liveness timeouts are several of these.
HEARTBEAT_S = 2.0
#: A participant (or observer) silent this long is lost, unless the manifest says otherwise
#: (``run.liveness_timeout_s``).
LIVENESS_TIMEOUT_S = 30.0
#: The reply of finish(), cancel() and heartbeat(); shutdown() answers :data:`BYE`.
ACK = "ok"
BYE = "bye"

M = TypeVar("M", bound="Message")


class ProtocolError(TracrError):
    """A control message that does not decode into the type its call expects."""


@dataclass(frozen=True)
class Ready:
    """What a participant process announces once its control server listens."""

    port: int
    pid: int

    def line(self) -> str:
        """The stdout line, without its newline."""
        return READY_PREFIX + json.dumps({"port": self.port, "pid": self.pid})

    @classmethod
    def parse(cls, line: str) -> Ready | None:
        """The announcement in ``line``, or None when the line is something else."""
        line = line.strip()
        if not line.startswith(READY_PREFIX):
            return None
        data = json.loads(line[len(READY_PREFIX):])
        return cls(port=int(data["port"]), pid=int(data["pid"]))


class Message:
    """Base of the control messages: dataclasses that travel as JSON objects.

    ``omit_none`` leaves unset (None) fields out of the JSON, so an optional
    field reads the same to the other side whether it was sent empty or not at
    all. A message with an ``extra`` field is open: keys it does not name are
    kept there (a user's role may add its own) and written back flat; a closed
    message refuses unknown keys. A field typed as another message (``model:
    ModelConfig``) travels as that message's JSON object, and may be given as one.
    """

    omit_none: ClassVar[bool] = False

    def __post_init__(self) -> None:
        for name, kind in nested_messages(type(self)).items():
            value = getattr(self, name)
            if isinstance(value, dict):
                setattr(self, name, kind.from_dict(value))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "extra":
                out.update(value)
            elif isinstance(value, Message):
                out[f.name] = value.to_dict()
            elif not (value is None and self.omit_none):
                out[f.name] = value
        return out

    def to_json(self) -> str:
        """The wire form."""
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls: type[M], data: Any) -> M:
        """Inverse of :meth:`to_dict`; a missing field takes its default."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ProtocolError(f"{cls.__name__}: expected a JSON object, got {data!r}")
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        known = {k: v for k, v in data.items() if k in names and k != "extra"}
        unknown = {k: v for k, v in data.items() if k not in names or k == "extra"}
        if unknown:
            if "extra" not in names:
                raise ProtocolError(f"{cls.__name__}: unexpected field(s) {sorted(unknown)}")
            known["extra"] = unknown
        try:
            return cls(**known)
        except TypeError as exc:  # a required field is missing
            raise ProtocolError(f"{cls.__name__}: {exc}") from None

    @classmethod
    def from_json(cls: type[M], text: str | None) -> M:
        """Decode the wire form (an empty string or ``null`` gives the defaults)."""
        try:
            data = json.loads(text) if text else None
        except ValueError as exc:
            raise ProtocolError(f"{cls.__name__}: not JSON: {exc}") from None
        return cls.from_dict(data)


@functools.cache
def nested_messages(cls: type[Message]) -> dict[str, type[Message]]:
    """The fields of ``cls`` typed as a message (alone or ``| None``), by name."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        hint = hints.get(f.name)
        union = typing.get_origin(hint) in (types.UnionType, typing.Union)
        for kind in typing.get_args(hint) if union else (hint,):
            if isinstance(kind, type) and issubclass(kind, Message):
                out[f.name] = kind
    return out


def encode_reply(value: Any) -> str:
    """A reply as its JSON document (a message, a plain value or None)."""
    if isinstance(value, Message):
        return value.to_json()
    return json.dumps(value)


def decode_reply(text: Any) -> Any:
    """The plain value of a JSON reply."""
    if not isinstance(text, str):
        raise ProtocolError(f"expected a JSON reply, got {type(text).__name__}")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ProtocolError(f"reply is not JSON: {exc}: {text[:80]!r}") from None
