"""The participant-to-participant data path: framed, authenticated tensor channels.

Crossing tensors travel as raw or blosc2-compressed buffers on a dedicated TCP
connection (never pickled, never through rpyc), after a mutual HMAC-SHA256
challenge-response on the run's secret that also derives the connection's own keys;
every frame then carries AES-GCM tags (and is encrypted with ``encrypt=True``)::

    # receiving participant (cloud)                  # sending participant (edge)
    server = DataServer("127.0.0.1", 0, secret, cfg)
    port = server.address[1]   # -> partner          ch = connect(host, port, secret, cfg)
    ch = server.accept(timeout=30)
    header, tensors, stats = ch.recv()               ch.send({"split": 4}, {"x": tensor})

``DataChannel.request`` times a message and its reply on the sender's clock, and
``DataChannel.probe`` measures the link (rtt, bandwidth) while the partner sits in
``recv()``. Header ops ``__probe__`` and ``__probe_ack__`` are reserved for that.
"""

from experiment_design.transport.channel import (
    PROBE_ACK_OP,
    PROBE_OP,
    DataChannel,
    RecvStats,
    RequestStats,
    SendStats,
)
from experiment_design.transport.codec import CODECS, DTYPES, FILTERS, CodecConfig
from experiment_design.transport.errors import (
    AuthError,
    ChannelClosed,
    IntegrityError,
    ProtocolError,
    TransportError,
)
from experiment_design.transport.frame import Limits
from experiment_design.transport.server import DataServer, connect
from experiment_design.transport.session import Session, derive

__all__ = [
    "CODECS",
    "DTYPES",
    "FILTERS",
    "PROBE_ACK_OP",
    "PROBE_OP",
    "AuthError",
    "ChannelClosed",
    "CodecConfig",
    "DataChannel",
    "DataServer",
    "IntegrityError",
    "Limits",
    "ProtocolError",
    "RecvStats",
    "RequestStats",
    "SendStats",
    "Session",
    "TransportError",
    "connect",
    "derive",
]
