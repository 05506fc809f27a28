"""``@control``: what every exposed method of a participant does around its body.

The observer's call is a heartbeat (the idle watchdog must not fire), counts as
work in progress while it runs (set-up may outlast the idle limit), arrives as
a JSON string to decode into its message type, leaves as one JSON document,
and fails as one readable :class:`TracrError` naming the participant::

    class EchoRole(ParticipantService):
        @control(PollRequest)
        def exposed_echo(self, req: PollRequest) -> dict:
            return {"waited": req.wait_s}

``conn.root.echo('{"wait_s": 1}')`` then answers ``'{"waited": 1}'``.
"""

from __future__ import annotations

import functools
import logging
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from experiment_design.errors import TracrError
from experiment_design.protocol import Message, ProtocolError, encode_reply

log = logging.getLogger(__name__)


class Controlled(Protocol):
    """What ``@control`` needs of the service it decorates (``ParticipantService``)."""

    instance: str
    role_name: str

    def touch(self) -> None:
        """Record that the observer is alive."""

    def begin_call(self) -> None:
        """A call starts: the idle watchdog waits for it."""

    def end_call(self) -> None:
        """A call ended."""


@contextmanager
def serving(service: Controlled) -> Iterator[None]:
    """Run a call's body: counted as in progress, any failure one :class:`TracrError`."""
    service.begin_call()
    try:
        yield
    except TracrError:
        raise
    except Exception as exc:
        log.debug("%s", traceback.format_exc())
        who = service.instance or service.role_name
        raise TracrError(f"{who}: {type(exc).__name__}: {exc}") from exc
    finally:
        service.end_call()
        service.touch()


def decode_argument(kind: type[Message], arg: Any) -> Message:
    """The call's argument as ``kind``: a JSON string, or a bare number or None (rpyc
    passes those by value; containers would be references, so they are refused)."""
    if arg is None or isinstance(arg, str):
        return kind.from_json(arg)
    if isinstance(arg, (bool, int, float)):
        return kind.from_dict(arg)
    raise ProtocolError(f"{kind.__name__}: expected a JSON string, got {type(arg).__name__}")


def control(request: type[Message] | None = None) -> Callable[[Callable[..., Any]], Callable]:
    """Decorate an ``exposed_`` method: heartbeat, decoding into ``request``, JSON reply,
    error mapping. Without ``request`` the method takes no argument."""

    def deco(fn: Callable[..., Any]) -> Callable[..., str]:
        if request is None:

            @functools.wraps(fn)
            def exposed(self: Controlled) -> str:
                self.touch()
                with serving(self):
                    return encode_reply(fn(self))
        else:

            @functools.wraps(fn)
            def exposed(self: Controlled, arg: Any = None) -> str:  # type: ignore[misc]
                self.touch()
                with serving(self):
                    return encode_reply(fn(self, decode_argument(request, arg)))

        exposed.request = request  # type: ignore[attr-defined]
        return exposed

    return deco


__all__ = ["Controlled", "control", "decode_argument", "serving"]
