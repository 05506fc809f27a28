"""Mutual HMAC-SHA256 challenge-response on the run's secret, before any frame is read.

Both sides prove they hold the secret without sending it, each on a nonce the other
chose, and each proof is bound to a role label so a peer cannot reflect our own
challenge back at us::

    server -> client   MAGIC, server_nonce                              (40 bytes)
    client -> server   client_nonce, HMAC(secret, "client" | sn | cn)   (64 bytes)
    server -> client   HMAC(secret, "server" | cn | sn)                 (32 bytes)

A server that sees a wrong proof closes the socket without answering, so the client
learns nothing it could replay.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket

from experiment_design.transport.errors import AuthError, ChannelClosed, ProtocolError

MAGIC = b"TRCRAUTH"  # 8 bytes; a different magic also tells a non-tracr peer apart quickly
NONCE = 32
DIGEST = 32


def _proof(secret: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, label + first + second, hashlib.sha256).digest()


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes (small reads only: handshake and frame prefixes)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ChannelClosed(f"peer closed the connection after {got} of {n} bytes")
        got += k
    return bytes(buf)


def check_secret(secret: bytes) -> bytes:
    """Accept a non-empty ``bytes`` secret (the runtime passes the decoded hex line)."""
    if not isinstance(secret, (bytes, bytearray)) or len(secret) < 16:
        raise AuthError("the data path needs a per-run secret of at least 16 bytes")
    return bytes(secret)


def server_handshake(sock: socket.socket, secret: bytes) -> None:
    """Authenticate a freshly accepted peer; raises :class:`AuthError` if it fails."""
    sn = os.urandom(NONCE)
    sock.sendall(MAGIC + sn)
    reply = recv_exact(sock, NONCE + DIGEST)
    cn, proof = reply[:NONCE], reply[NONCE:]
    if not hmac.compare_digest(proof, _proof(secret, b"client", sn, cn)):
        raise AuthError("peer failed the data-path challenge (wrong secret or not a tracr peer)")
    sock.sendall(_proof(secret, b"server", cn, sn))


def client_handshake(sock: socket.socket, secret: bytes) -> None:
    """Authenticate to a :class:`DataServer` and check that it holds the secret too."""
    hello = recv_exact(sock, len(MAGIC) + NONCE)
    if hello[: len(MAGIC)] != MAGIC:
        raise ProtocolError("the peer is not a tracr data server (bad greeting)")
    sn = hello[len(MAGIC) :]
    cn = os.urandom(NONCE)
    sock.sendall(cn + _proof(secret, b"client", sn, cn))
    try:
        answer = recv_exact(sock, DIGEST)
    except ChannelClosed:
        raise AuthError(
            "the data server rejected our proof", hint="both sides must use the same run secret"
        ) from None
    if not hmac.compare_digest(answer, _proof(secret, b"server", cn, sn)):
        raise AuthError("the data server could not prove it holds the run secret")
