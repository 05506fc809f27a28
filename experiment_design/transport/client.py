"""Opening data channels: :func:`connect` on the sending participant (the receiving side
is :class:`experiment_design.transport.server.DataServer`)."""

from __future__ import annotations

import socket
import time

from experiment_design.transport import auth
from experiment_design.transport.channel import DataChannel
from experiment_design.transport.codec import CodecConfig
from experiment_design.transport.errors import ChannelClosed, TransportError
from experiment_design.transport.frame import Limits


def tune(sock: socket.socket) -> None:
    """Set a data connection's socket options (both ends)."""
    # Small messages (acks, headers, probe rtts) must not wait for Nagle's timer.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def connect(
    host: str,
    port: int,
    secret: bytes | None,
    codec: CodecConfig,
    timeout: float = 10.0,
    *,
    limits: Limits | None = None,
    name: str = "client",
    partner: str = "server",
    key: bytes | None = None,
) -> DataChannel:
    """Open an authenticated data channel, as ``name``, to the :class:`DataServer` of
    ``partner``: with the link's ``key`` (what the observer hands a participant), or the
    key derived from the run's ``secret`` for the two names.

    A refused connection, or one the server closes before greeting us (it is still
    starting), is retried until ``timeout``; a failed handshake is not (a wrong key, or a
    server that is not ``partner``, will not get better).
    """
    key = auth.check_secret(key) if key is not None else auth.link_key(secret, partner, name)
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, remaining))
        except (ConnectionRefusedError, TimeoutError) as exc:
            if time.monotonic() + 0.05 >= deadline:
                raise TransportError(
                    f"cannot open a data channel to {partner} at {host}:{port}: {exc}",
                    hint="is the partner's data server running and reachable from here?",
                ) from None
            time.sleep(0.05)
            continue
        except OSError as exc:
            raise TransportError(
                f"cannot open a data channel to {partner} at {host}:{port}: {exc}") from None
        try:
            tune(sock)
            session = auth.client_handshake(sock, key, codec.encrypt, deadline, name=name,
                                            partner=partner)
            sock.settimeout(None)
        except ChannelClosed as exc:
            sock.close()
            if getattr(exc, "received", 1) == 0 and time.monotonic() + 0.05 < deadline:
                time.sleep(0.05)  # closed before the greeting: busy, try again
                continue
            raise TransportError(
                f"data-channel handshake with {partner} at {host}:{port} failed: {exc}",
                hint="the partner's data server refuses connections from this address, "
                     "or has all its partners already",
            ) from None
        except TransportError:
            sock.close()
            raise
        except OSError as exc:
            sock.close()
            raise TransportError(
                f"data-channel handshake with {partner} at {host}:{port} failed: "
                f"{exc or 'timed out'}",
                hint="the partner did not finish the handshake in time",
            ) from None
        channel = DataChannel(sock, codec, limits, session=session)
        channel.partner = partner
        return channel
