"""HMAC challenge-response in front of the rpyc control connection.

The server sends a random nonce; the client answers HMAC-SHA256(secret,
nonce); only then does rpyc speak. A wrong answer closes the socket before
any rpyc frame is parsed.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
from typing import Any

NONCE_LEN = 32
MAC_LEN = 32
OK = b"TRACR-OK\n"
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


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed during authentication")
        buf += chunk
    return bytes(buf)


def mac(secret: bytes, nonce: bytes) -> bytes:
    """The answer to a challenge."""
    return hmac.new(secret, b"tracr-control\0" + nonce, hashlib.sha256).digest()


class HmacAuthenticator:
    """rpyc authenticator: ``__call__(sock) -> (sock, credentials)`` or raises."""

    def __init__(self, secret: bytes, timeout: float = 10.0) -> None:
        self.secret = secret
        self.timeout = timeout

    def __call__(self, sock: socket.socket) -> tuple[socket.socket, Any]:
        from rpyc.utils.authenticators import AuthenticationError

        nonce = os.urandom(NONCE_LEN)
        old = sock.gettimeout()
        try:
            sock.settimeout(self.timeout)
            sock.sendall(nonce)
            answer = _recv_exact(sock, MAC_LEN)
            if not hmac.compare_digest(answer, mac(self.secret, nonce)):
                raise AuthenticationError("wrong control token")
            sock.sendall(OK)
        except (OSError, ConnectionError) as exc:
            raise AuthenticationError(f"authentication failed: {exc}") from exc
        finally:
            try:
                sock.settimeout(old)
            except OSError:
                pass
        return sock, "observer"


def connect_control(host: str, port: int, secret: bytes, timeout: float = 10.0) -> Any:
    """Client side: answer the challenge, then hand the socket to rpyc."""
    import rpyc
    from rpyc.core.stream import SocketStream

    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        nonce = _recv_exact(sock, NONCE_LEN)
        sock.sendall(mac(secret, nonce))
        if _recv_exact(sock, len(OK)) != OK:
            raise ConnectionError("participant refused the control token")
    except (OSError, ConnectionError) as exc:
        sock.close()
        raise ConnectionError(f"control connection to {host}:{port} refused: {exc}") from exc
    sock.settimeout(None)
    conn = rpyc.connect_stream(SocketStream(sock), rpyc.VoidService, config=dict(PROTOCOL_CONFIG))
    conn.root  # noqa: B018 - fetched now (a bounded round trip), so later calls need no sync one
    return conn


def control_server(service: Any, secret: bytes, host: str = "127.0.0.1", port: int = 0,
                   logger: Any = None) -> Any:
    """A listening rpyc ThreadedServer for ``service`` behind :class:`HmacAuthenticator`.

    rpyc only calls listen() inside start(); it is done here so that the port
    is connectable as soon as this returns (the READY line promises that).
    """
    from rpyc.utils.server import ThreadedServer

    server = ThreadedServer(
        service, hostname=host, port=port, authenticator=HmacAuthenticator(secret),
        protocol_config=dict(PROTOCOL_CONFIG), logger=logger, listener_timeout=0.5,
    )
    server._listen()
    return server
