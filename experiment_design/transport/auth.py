"""Mutual HMAC-SHA256 challenge-response on the run's secret, before any frame is read.

Both sides prove they hold the secret without sending it, each on a nonce the other
chose, and each proof covers everything said so far (mode included) and a role label,
so a peer cannot reflect our own challenge back at us nor talk us out of encryption::

    server -> client   hello = MAGIC, version, mode, server_nonce                   (42 bytes)
    client -> server   reply = mode, client_nonce, HMAC(secret, "client" | hello | mode | cn)
                                                                                     (65 bytes)
    server -> client   HMAC(secret, "server" | hello | reply)                        (32 bytes)

Both sides then derive the connection's session keys from the secret and both nonces
(:func:`experiment_design.transport.session.derive`). A server that sees a wrong proof
closes the socket without answering, so the client learns nothing it could replay. The
whole exchange runs against one deadline, not a timeout per read: a peer that trickles
bytes is dropped when the deadline passes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import time

from experiment_design.transport.errors import AuthError, ChannelClosed, ProtocolError
from experiment_design.transport.session import Session, derive

MAGIC = b"TRCRAUTH"  # 8 bytes; a different magic also tells a non-tracr peer apart quickly
VERSION = 3
NONCE = 32
DIGEST = 32
HELLO = len(MAGIC) + 2 + NONCE
REPLY = 1 + NONCE + DIGEST


def _proof(secret: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, label + b"".join(parts), hashlib.sha256).digest()


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """Read exactly ``n`` bytes (small reads only: handshake and frame prefixes), by
    ``deadline`` (``time.monotonic()``) when given."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"handshake not finished in time ({got} of {n} bytes)")
            sock.settimeout(left)
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            err = ChannelClosed(f"peer closed the connection after {got} of {n} bytes")
            err.received = got  # 0: closed before saying anything (a busy server, say)
            raise err
        got += k
    return bytes(buf)


def _send_by(sock: socket.socket, data: bytes, deadline: float) -> None:
    sock.settimeout(max(0.001, deadline - time.monotonic()))
    sock.sendall(data)


def check_secret(secret: bytes) -> bytes:
    """Accept a non-empty ``bytes`` secret (the runtime passes the decoded hex line)."""
    if not isinstance(secret, (bytes, bytearray)) or len(secret) < 16:
        raise AuthError("the data path needs a per-run secret of at least 16 bytes")
    return bytes(secret)


def _mode(encrypt: bool) -> bytes:
    return b"\x01" if encrypt else b"\x00"


def server_handshake(
    sock: socket.socket, secret: bytes, encrypt: bool, deadline: float
) -> Session:
    """Authenticate a freshly accepted peer by ``deadline``; its session, or :class:`AuthError`."""
    sn = os.urandom(NONCE)
    hello = MAGIC + bytes([VERSION]) + _mode(encrypt) + sn
    _send_by(sock, hello, deadline)
    reply = recv_exact(sock, REPLY, deadline)
    mode, cn, proof = reply[:1], reply[1 : 1 + NONCE], reply[1 + NONCE :]
    if not hmac.compare_digest(proof, _proof(secret, b"client", hello, mode, cn)):
        raise AuthError("peer failed the data-path challenge (wrong secret or not a tracr peer)")
    if mode != _mode(encrypt):
        raise AuthError("peer asked for a different transport.encrypt setting")
    _send_by(sock, _proof(secret, b"server", hello, reply), deadline)
    return derive(secret, sn, cn, encrypt)[1]


def client_handshake(
    sock: socket.socket, secret: bytes, encrypt: bool, deadline: float
) -> Session:
    """Authenticate to a :class:`DataServer` by ``deadline``, check that it holds the
    secret too, and return this side's session."""
    hello = recv_exact(sock, HELLO, deadline)
    if hello[: len(MAGIC)] != MAGIC:
        raise ProtocolError("the peer is not a tracr data server (bad greeting)")
    if hello[len(MAGIC)] != VERSION:
        raise ProtocolError(
            f"the data server speaks handshake version {hello[len(MAGIC)]}, this side {VERSION}",
            hint="both participants must run the same tracr version",
        )
    if hello[len(MAGIC) + 1 : len(MAGIC) + 2] != _mode(encrypt):
        raise AuthError(
            "the data server and this side disagree on transport.encrypt",
            hint="both participants take transport.encrypt from the same manifest",
        )
    sn = hello[len(MAGIC) + 2 :]
    cn = os.urandom(NONCE)
    mode = _mode(encrypt)
    reply = mode + cn + _proof(secret, b"client", hello, mode, cn)
    _send_by(sock, reply, deadline)
    try:
        answer = recv_exact(sock, DIGEST, deadline)
    except ChannelClosed:
        raise AuthError(
            "the data server rejected our proof", hint="both sides must use the same run secret"
        ) from None
    if not hmac.compare_digest(answer, _proof(secret, b"server", hello, reply)):
        raise AuthError("the data server could not prove it holds the run secret")
    return derive(secret, sn, cn, encrypt)[0]
