"""Opening data channels: :class:`DataServer` on the receiving participant, :func:`connect` on the sender."""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time

from experiment_design.transport.auth import check_secret, client_handshake, server_handshake
from experiment_design.transport.channel import DataChannel
from experiment_design.transport.codec import CodecConfig
from experiment_design.transport.errors import ChannelClosed, TransportError
from experiment_design.transport.frame import Limits

log = logging.getLogger(__name__)


def _tune(sock: socket.socket) -> None:
    # Small messages (acks, headers, probe rtts) must not wait for Nagle's timer.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class DataServer:
    """Listens for partners' data channels; only peers that prove they hold ``secret`` get through.

    Handshakes run concurrently, each on its own short-lived thread with one deadline
    for the whole exchange (``handshake_timeout``), so a client that stalls or trickles
    bytes holds only its own slot. At most ``max_pending`` connections may be
    unauthenticated at once; further ones are closed as soon as they are accepted (a
    client retries those until its own deadline). A peer that fails the handshake,
    sends garbage or misses the deadline is logged and dropped.

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
        max_pending: int = 16,
    ) -> None:
        self.secret = check_secret(secret)
        self.codec = codec
        self.limits = limits or Limits()
        self.handshake_timeout = handshake_timeout
        self.max_pending = max_pending
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._sock = socket.create_server((host, port), family=family, backlog=backlog)
        except OSError as exc:
            raise TransportError(
                f"cannot listen for data channels on {host}:{port}: {exc}",
                hint="use port 0 to let the system choose a free port",
            ) from exc
        self.rejected = 0  # peers dropped so far (failed auth, garbage, stalled, over the cap)
        self.pending = 0  # connections in their handshake now
        self._lock = threading.Lock()
        self._ready: queue.Queue[DataChannel | None] = queue.Queue()
        self._closed = False
        self._acceptor = threading.Thread(
            target=self._accept_loop, name="data-accept", daemon=True
        )
        self._acceptor.start()

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); the port is the real one when 0 was asked for."""
        host, port = self._sock.getsockname()[:2]
        return host, port

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, addr = self._sock.accept()
            except OSError:
                if self._closed:
                    break
                time.sleep(0.05)  # e.g. out of file descriptors: do not spin
                continue
            with self._lock:
                full = self.pending >= self.max_pending
                if full:
                    self.rejected += 1
                else:
                    self.pending += 1
            if full:
                log.warning(
                    "dropped data-channel peer %s:%s: %d handshakes already pending",
                    addr[0], addr[1], self.max_pending,
                )
                conn.close()
                continue
            threading.Thread(
                target=self._handshake, args=(conn, addr), name="data-handshake", daemon=True
            ).start()
        self._ready.put(None)  # wakes a waiting accept()

    def _handshake(self, conn: socket.socket, addr: tuple) -> None:
        deadline = time.monotonic() + self.handshake_timeout
        try:
            _tune(conn)
            session = server_handshake(conn, self.secret, self.codec.encrypt, deadline)
            conn.settimeout(None)
        except (TransportError, OSError) as exc:
            with self._lock:
                self.rejected += 1
                self.pending -= 1
            log.warning("dropped data-channel peer %s:%s: %s", addr[0], addr[1], exc or "timed out")
            conn.close()
            return
        log.debug("data channel from %s:%s authenticated", addr[0], addr[1])
        channel = DataChannel(conn, self.codec, self.limits, session=session)
        with self._lock:
            self.pending -= 1
            closed = self._closed
        if closed:
            channel.close()
        else:
            self._ready.put(channel)

    def accept(self, timeout: float | None = None) -> DataChannel:
        """Wait for the next authenticated peer (``timeout`` seconds in all, None = forever)."""
        if self._closed:
            raise TransportError("the data server stopped accepting: it is closed")
        try:
            channel = self._ready.get(timeout=timeout)
        except queue.Empty:
            raise TransportError(
                f"no authenticated data channel within {timeout:.1f} s on port {self.address[1]}",
                hint="check that the partner can reach this address and uses the same run secret",
            ) from None
        if channel is None:
            self._ready.put(None)  # for any other waiter
            raise TransportError("the data server stopped accepting: it is closed")
        return channel

    def close(self) -> None:
        """Stop listening (channels already accepted stay open); a blocked :meth:`accept` returns."""
        with self._lock:
            self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept() on Linux
        except OSError:
            pass
        self._sock.close()
        self._ready.put(None)
        while True:  # authenticated but never accepted: ours to close
            try:
                channel = self._ready.get_nowait()
            except queue.Empty:
                break
            if channel is not None:
                channel.close()
        self._ready.put(None)

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

    A refused connection, or one the server closes before greeting us (it is still
    starting, or busy with its cap of pending handshakes), is retried until ``timeout``;
    a failed handshake is not (a wrong secret will not get better).
    """
    secret = check_secret(secret)
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, remaining))
        except (ConnectionRefusedError, TimeoutError) as exc:
            if time.monotonic() + 0.05 >= deadline:
                raise TransportError(
                    f"cannot open a data channel to {host}:{port}: {exc}",
                    hint="is the partner's data server running and reachable from here?",
                ) from None
            time.sleep(0.05)
            continue
        except OSError as exc:
            raise TransportError(f"cannot open a data channel to {host}:{port}: {exc}") from None
        try:
            _tune(sock)
            session = client_handshake(sock, secret, codec.encrypt, deadline)
            sock.settimeout(None)
        except ChannelClosed as exc:
            sock.close()
            if getattr(exc, "received", 1) == 0 and time.monotonic() + 0.05 < deadline:
                time.sleep(0.05)  # closed before the greeting: busy, try again
                continue
            raise TransportError(
                f"data-channel handshake with {host}:{port} failed: {exc}"
            ) from None
        except TransportError:
            sock.close()
            raise
        except OSError as exc:
            sock.close()
            raise TransportError(
                f"data-channel handshake with {host}:{port} failed: {exc or 'timed out'}",
                hint="the partner did not finish the handshake in time",
            ) from None
        return DataChannel(sock, codec, limits, session=session)
