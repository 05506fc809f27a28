"""The participant-to-participant data path: framed, authenticated tensor channels.

Crossing tensors travel as raw or blosc2-compressed buffers on a dedicated TCP
connection (never pickled, never through rpyc), after a mutual HMAC-SHA256
challenge-response on the link's own key (derived from the run's secret and both ends'
names, :func:`link_key`) that also derives the connection's own keys; every frame then
carries AES-GCM tags (and is encrypted with ``encrypt=True``)::

    # receiving participant (cloud)                  # sending participant (edge)
    server = DataServer("127.0.0.1", 0, None, cfg, name="cloud")
    port = server.address[1]   # -> observer
    server.admit([Partner("edge", key, ("10.0.0.2",))])
                                                     ch = connect(host, port, None, cfg,
                                                                  name="edge",
                                                                  partner="cloud", key=key)
    ch = server.accept(timeout=30)
    header, tensors, stats = ch.recv()               ch.send({"split": 4}, {"x": tensor})

``DataChannel.request`` times a message and its reply on the sender's clock, and
``DataChannel.probe`` measures the link (rtt, bandwidth) while the partner sits in
``recv()``. Header ops ``__probe__`` and ``__probe_ack__`` are reserved for that.
"""

from experiment_design.transport.auth import link_key
from experiment_design.transport.channel import (
    PROBE_ACK_OP,
    PROBE_OP,
    DataChannel,
    RecvStats,
    RequestStats,
    SendStats,
)
from experiment_design.transport.client import connect
from experiment_design.transport.codec import CODECS, DTYPES, FILTERS, CodecConfig
from experiment_design.transport.errors import (
    AuthError,
    ChannelClosed,
    IntegrityError,
    ProtocolError,
    TransportError,
)
from experiment_design.transport.frame import Limits
from experiment_design.transport.server import DataServer, Partner
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
    "Partner",
    "ProtocolError",
    "RecvStats",
    "RequestStats",
    "SendStats",
    "Session",
    "TransportError",
    "connect",
    "derive",
    "link_key",
]
