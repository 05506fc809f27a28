"""What a data channel's messages cost: the figures a
:class:`~experiment_design.transport.channel.DataChannel` returns from a send, a receive
and a round trip, each read on one side's own clock.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(slots=True)
class SendStats:
    """What one :meth:`DataChannel.send` cost on the sender.

    ``send_ms`` is the time to hand the frame to the kernel; on a fast link that is close
    to the transfer, on a slow one the bytes may still be in flight when it returns.
    The transfer time proper is a round trip on this clock: see :meth:`DataChannel.request`.
    """

    raw_bytes: int
    encoded_bytes: int
    encode_ms: float
    send_ms: float
    wire_bytes: int = 0  # prefix + header + payload

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON view."""
        return asdict(self)


@dataclass(slots=True)
class RecvStats:
    """What one :meth:`DataChannel.recv` cost on the receiver.

    ``recv_ms`` runs from the arrival of the frame's prefix to its last byte (waiting for
    the peer to start sending is not counted); ``decode_ms`` is decompression only.
    """

    raw_bytes: int
    encoded_bytes: int
    decode_ms: float
    recv_ms: float
    wire_bytes: int = 0
    codec: str = "none"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON view."""
        return asdict(self)


@dataclass(frozen=True)
class RequestStats:
    """A request and its reply, timed on the requester's clock.

    ``rtt_ms`` runs from the first byte written to the last reply byte read (encoding and
    decoding excluded) and so includes whatever the peer did before replying; a peer that
    reports its own processing time in the reply header lets the caller subtract it.
    """

    send: SendStats
    recv: RecvStats
    rtt_ms: float

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON view."""
        return {"send": self.send.to_dict(), "recv": self.recv.to_dict(), "rtt_ms": self.rtt_ms}
