"""Opening data channels: :class:`DataServer` on the receiving participant, :func:`connect` on the sender."""

from __future__ import annotations

import logging
import socket
import time

from experiment_design.transport.auth import check_secret, client_handshake, server_handshake
from experiment_design.transport.channel import DataChannel
from experiment_design.transport.codec import CodecConfig
from experiment_design.transport.errors import TransportError
from experiment_design.transport.frame import Limits

log = logging.getLogger(__name__)


def _tune(sock: socket.socket) -> None:
    # Small messages (acks, headers, probe rtts) must not wait for Nagle's timer.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class DataServer:
    """Listens for partners' data channels; only peers that prove they hold ``secret`` get through.

    A peer that fails the handshake, sends garbage or stalls longer than
    ``handshake_timeout`` is logged and dropped, and :meth:`accept` keeps waiting for the
    next one, so one bad client cannot lock out a good one.

    >>> # server = DataServer("127.0.0.1", 0, secret, CodecConfig())
    >>> # port = server.address[1]          # tell the partner (over the control channel)
    >>> # channel = server.accept(timeout=30)
    """

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes,
        codec: CodecConfig,
        *,
        handshake_timeout: float = 5.0,
        limits: Limits | None = None,
        backlog: int = 16,
    ) -> None:
        self.secret = check_secret(secret)
        self.codec = codec
        self.limits = limits or Limits()
        self.handshake_timeout = handshake_timeout
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._sock = socket.create_server((host, port), family=family, backlog=backlog)
        except OSError as exc:
            raise TransportError(
                f"cannot listen for data channels on {host}:{port}: {exc}",
                hint="use port 0 to let the system choose a free port",
            ) from exc
        self.rejected = 0  # peers dropped so far (failed auth, garbage, stalled)

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); the port is the real one when 0 was asked for."""
        host, port = self._sock.getsockname()[:2]
        return host, port

    def accept(self, timeout: float | None = None) -> DataChannel:
        """Wait for the next authenticated peer (``timeout`` seconds in all, None = forever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._sock.settimeout(remaining)
            try:
                conn, addr = self._sock.accept()
            except TimeoutError:
                raise TransportError(
                    f"no authenticated data channel within {timeout:.1f} s on port {self.address[1]}",
                    hint="check that the partner can reach this address and uses the same run secret",
                ) from None
            except OSError as exc:
                raise TransportError(f"the data server stopped accepting: {exc}") from exc
            try:
                _tune(conn)
                conn.settimeout(self.handshake_timeout)
                server_handshake(conn, self.secret)
                conn.settimeout(None)
            except (TransportError, OSError) as exc:
                self.rejected += 1
                log.warning("dropped data-channel peer %s:%s: %s", addr[0], addr[1], exc)
                conn.close()
                continue
            log.debug("data channel from %s:%s authenticated", addr[0], addr[1])
            return DataChannel(conn, self.codec, self.limits)

    def close(self) -> None:
        """Stop listening (channels already accepted stay open); a blocked :meth:`accept` returns."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept() on Linux
        except OSError:
            pass
        self._sock.close()

    def __enter__(self) -> DataServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    host: str,
    port: int,
    secret: bytes,
    codec: CodecConfig,
    timeout: float = 10.0,
    *,
    limits: Limits | None = None,
) -> DataChannel:
    """Open an authenticated data channel to a partner's :class:`DataServer`.

    A refused connection is retried until ``timeout`` (the partner may still be starting);
    a failed handshake is not (a wrong secret will not get better).
    """
    secret = check_secret(secret)
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, remaining))
            break
        except (ConnectionRefusedError, TimeoutError) as exc:
            if time.monotonic() + 0.05 >= deadline:
                raise TransportError(
                    f"cannot open a data channel to {host}:{port}: {exc}",
                    hint="is the partner's data server running and reachable from here?",
                ) from None
            time.sleep(0.05)
        except OSError as exc:
            raise TransportError(f"cannot open a data channel to {host}:{port}: {exc}") from None
    try:
        _tune(sock)
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        client_handshake(sock, secret)
        sock.settimeout(None)
    except TransportError:
        sock.close()
        raise
    except OSError as exc:
        sock.close()
        raise TransportError(f"data-channel handshake with {host}:{port} failed: {exc}") from None
    return DataChannel(sock, codec, limits)
