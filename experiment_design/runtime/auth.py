"""Mutual HMAC challenge-response in front of the rpyc control connection.

Both sides prove they hold the run's secret, each on a nonce the other chose, before
rpyc speaks; each proof covers the whole exchange and a role label, so neither can be
reflected back::

    participant -> observer   MAGIC, participant nonce                        (40 bytes)
    observer -> participant   observer nonce, HMAC(secret, "client" | hello | on)  (64 bytes)
    participant -> observer   HMAC(secret, "server" | hello | reply)               (32 bytes)

A wrong answer closes the socket before any rpyc frame is parsed; an observer that gets
a wrong (or no) proof back refuses the participant. The participant's server runs the
exchange against one deadline, with at most :data:`MAX_PENDING` connections in it at
once (more are closed as soon as they are accepted).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

MAGIC = b"TRCRCTL3"
NONCE_LEN = 32
MAC_LEN = 32
# The observer's runner makes every call asynchronously and bounds it itself (per call,
# with liveness and Ctrl-C checks: app_api/runner/client.py); this bounds any other
# synchronous call (a script's, a test's, rpyc's own root fetch). rpyc's default 30 s
# would cut a long setup() (model build, dataset load) made that way.
SYNC_TIMEOUT_S = 300

PROTOCOL_CONFIG: dict[str, Any] = {
    "allow_pickle": False,
    "allow_public_attrs": False,
    "allow_all_attrs": False,
    "allow_setattr": False,
    "allow_delattr": False,
    "sync_request_timeout": SYNC_TIMEOUT_S,
}


HANDSHAKE_S = 10.0  # the whole exchange, not each read
MAX_PENDING = 16  # unauthenticated control connections at once


class _Closed(ConnectionError):
    """The peer closed the connection during the handshake, after ``received`` bytes."""

    def __init__(self, message: str, received: int) -> None:
        super().__init__(message)
        self.received = received


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ConnectionError(f"handshake not finished in time ({len(buf)} of {n} bytes)")
        sock.settimeout(left)
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise _Closed(f"peer closed during authentication ({len(buf)} of {n} bytes)", len(buf))
        buf += chunk
    return bytes(buf)


def mac(secret: bytes, label: bytes, *parts: bytes) -> bytes:
    """A proof: HMAC-SHA256 over a role label and what was said so far."""
    return hmac.new(secret, b"tracr-control\0" + label + b"".join(parts), hashlib.sha256).digest()


class HmacAuthenticator:
    """rpyc authenticator: ``__call__(sock) -> (sock, credentials)`` or raises."""

    def __init__(self, secret: bytes, timeout: float = HANDSHAKE_S) -> None:
        self.secret = secret
        self.timeout = timeout

    def __call__(self, sock: socket.socket) -> tuple[socket.socket, Any]:
        from rpyc.utils.authenticators import AuthenticationError

        deadline = time.monotonic() + self.timeout
        hello = MAGIC + os.urandom(NONCE_LEN)
        old = sock.gettimeout()
        try:
            sock.settimeout(self.timeout)
            sock.sendall(hello)
            reply = _recv_exact(sock, NONCE_LEN + MAC_LEN, deadline)
            if not hmac.compare_digest(reply[NONCE_LEN:], mac(self.secret, b"client", hello,
                                                              reply[:NONCE_LEN])):
                raise AuthenticationError("wrong control token")
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.sendall(mac(self.secret, b"server", hello, reply))
        except (OSError, ConnectionError) as exc:
            raise AuthenticationError(f"authentication failed: {exc}") from exc
        finally:
            try:
                sock.settimeout(old)
            except OSError:
                pass
        return sock, "observer"


def _handshake(sock: socket.socket, secret: bytes, deadline: float) -> None:
    """The observer's side: prove ourselves, then make the participant prove itself."""
    hello = _recv_exact(sock, len(MAGIC) + NONCE_LEN, deadline)  # _Closed(0): busy
    if hello[: len(MAGIC)] != MAGIC:
        raise ConnectionError("the peer is not a tracr participant (bad greeting)")
    on = os.urandom(NONCE_LEN)
    reply = on + mac(secret, b"client", hello, on)
    sock.sendall(reply)
    try:
        proof = _recv_exact(sock, MAC_LEN, deadline)
    except _Closed as exc:
        raise ConnectionError(f"participant refused the control token ({exc})") from None
    if not hmac.compare_digest(proof, mac(secret, b"server", hello, reply)):
        raise ConnectionError(
            "the participant could not prove it holds the run secret: "
            "not the participant this observer started"
        )


def connect_control(host: str, port: int, secret: bytes, timeout: float = 10.0) -> Any:
    """Client side: mutual challenge-response, then hand the socket to rpyc.

    A connection the participant closes before greeting (its cap of pending handshakes
    is full) is retried until ``timeout``; a failed proof is not.
    """
    import rpyc
    from rpyc.core.stream import SocketStream

    deadline = time.monotonic() + timeout
    while True:
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _handshake(sock, secret, deadline)
            break
        except (OSError, ConnectionError) as exc:
            sock.close()
            busy = isinstance(exc, _Closed) and exc.received == 0
            if busy and time.monotonic() + 0.05 < deadline:
                time.sleep(0.05)
                continue
            raise ConnectionError(f"control connection to {host}:{port} refused: {exc}") from exc
    sock.settimeout(None)
    conn = rpyc.connect_stream(SocketStream(sock), rpyc.VoidService, config=dict(PROTOCOL_CONFIG))
    conn.root  # noqa: B018 - fetched now (a bounded round trip), so later calls need no sync one
    return conn


def control_server(service: Any, secret: bytes, host: str = "127.0.0.1", port: int = 0,
                   logger: Any = None, *, max_pending: int = MAX_PENDING,
                   handshake_timeout: float = HANDSHAKE_S) -> Any:
    """A listening rpyc ThreadedServer for ``service`` behind :class:`HmacAuthenticator`.

    rpyc only calls listen() inside start(); it is done here so that the port
    is connectable as soon as this returns (the READY line promises that).
    """
    from rpyc.utils.server import ThreadedServer

    class _CappedServer(ThreadedServer):
        """rpyc's ThreadedServer with a cap on connections still in their handshake.

        A slot is taken when a connection is accepted and given back exactly once,
        wherever that connection's handshake ends: in the authenticator, or, for a
        connection that fails before it (rpyc reads the peer's address first, and a
        connection reset by then raises there), when its thread ends.
        """

        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            self.pending = 0
            self.refused = 0
            self._gate = threading.Lock()
            self._holding: set[int] = set()  # id() of the sockets that hold a slot
            inner = self.authenticator

            def authenticate(sock: socket.socket) -> tuple[socket.socket, Any]:
                try:
                    return inner(sock)
                finally:
                    self._release(sock)

            self.authenticator = authenticate

        def _release(self, sock: socket.socket) -> None:
            with self._gate:
                if id(sock) in self._holding:
                    self._holding.discard(id(sock))
                    self.pending -= 1

        def _accept_method(self, sock: socket.socket) -> None:
            with self._gate:
                full = self.pending >= max_pending
                if full:
                    self.refused += 1
                else:
                    self.pending += 1
                    self._holding.add(id(sock))
            if full:
                log.warning("refused a control connection: %d handshakes pending", max_pending)
                self.clients.discard(sock)
                sock.close()
                return
            try:
                super()._accept_method(sock)
            except BaseException:  # no thread was started: nobody else gives the slot back
                self._release(sock)
                self.clients.discard(sock)
                sock.close()
                raise

        def _authenticate_and_serve_client(self, sock: socket.socket) -> None:
            try:
                super()._authenticate_and_serve_client(sock)
            except OSError as exc:  # reset before rpyc read its address: nothing to serve
                log.info("control connection ended before authentication: %s", exc)
            finally:
                self._release(sock)

    server = _CappedServer(
        service, hostname=host, port=port,
        authenticator=HmacAuthenticator(secret, handshake_timeout),
        protocol_config=dict(PROTOCOL_CONFIG), logger=logger, listener_timeout=0.5,
    )
    server._listen()
    return server
