"""Mutual HMAC-SHA256 challenge-response on a link's key, before any frame is read.

Every link (a sending participant, the client, to a receiving one, the server) has a key
of its own, derived from the run's secret and both ends' names (:func:`link_key`). The
observer derives the keys and hands each participant only those of its own links, so a
participant that is compromised can speak as itself and nobody else, and a connection
that someone on the path redirects to another participant fails: the key differs, and
both names are said and bound into the proofs. Both sides prove they hold the key
without sending it, each on a nonce the other chose, and each proof covers everything
said so far (mode and names included) and a role label, so a peer cannot reflect our own
challenge back at us nor talk us out of encryption::

    server -> client   hello = MAGIC, version, mode, server_nonce, len, server name
                                                                  (43 + name bytes)
    client -> server   reply = mode, client_nonce, len, client name,
                               HMAC(key, "client" | hello | mode | cn | len | name)
                                                                  (66 + name bytes)
    server -> client   HMAC(key, "server" | hello | reply)                    (32 bytes)

The client checks that the server is the partner it meant to reach (its name) before it
says anything; the server looks the client's name up among the partners it admits and
uses that link's key. Both sides then derive the connection's session keys from the
link key and both nonces (:func:`experiment_design.transport.session.derive`). A server
that sees a wrong proof closes the socket without answering, so the client learns
nothing it could replay. The client's side runs against one deadline, not a timeout
per read; the server's side is a state machine driven by
:class:`~experiment_design.transport.server.DataServer`, which holds the same deadline.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import time

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from experiment_design.transport.errors import AuthError, ChannelClosed, ProtocolError
from experiment_design.transport.session import Session, derive

MAGIC = b"TRCRAUTH"  # 8 bytes; a different magic also tells a non-tracr peer apart quickly
VERSION = 4  # 4: per-link keys, both ends' names in the handshake
NONCE = 32
DIGEST = 32
MAX_NAME = 255  # bytes of a participant's name (UTF-8)
HELLO_HEAD = len(MAGIC) + 2 + NONCE + 1  # the hello up to the server's name
REPLY_HEAD = 1 + NONCE + 1  # the reply up to the client's name
#: the shortest reply (a one-byte name); tests that rewrite bytes after it use this
REPLY = REPLY_HEAD + 1 + DIGEST


def _proof(key: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, label + b"".join(parts), hashlib.sha256).digest()


def link_key(secret: bytes, server: str, client: str) -> bytes:
    """The key of the link from ``client`` to ``server`` (participant names): HKDF-SHA256
    over the run's secret with both names, each length-prefixed, in its info. Who holds
    the run's secret (the observer) can derive every link's key; a participant is given
    only the keys of its own links."""
    info = b"tracr link v1" + _name_bytes(server, "server") + _name_bytes(client, "client")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(
        check_secret(secret))


def _name_bytes(name: str, who: str) -> bytes:
    """A name as it is said in the handshake: its length (one byte), then UTF-8."""
    data = name.encode("utf-8") if isinstance(name, str) else b""
    if not 1 <= len(data) <= MAX_NAME:
        raise AuthError(f"a data-path {who} name must be 1-{MAX_NAME} bytes of UTF-8, "
                        f"got {name!r}")
    return bytes([len(data)]) + data


def decode_name(data: bytes) -> str:
    """A name a peer said (UTF-8); anything else is a :class:`ProtocolError`."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("the peer's name is not UTF-8") from None


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
    """Accept a ``bytes`` secret or key of at least 16 bytes (the runtime passes the
    decoded hex line)."""
    if not isinstance(secret, (bytes, bytearray)) or len(secret) < 16:
        raise AuthError("the data path needs a per-run secret of at least 16 bytes")
    return bytes(secret)


def mode_byte(encrypt: bool) -> bytes:
    """The mode as it is said in the handshake."""
    return b"\x01" if encrypt else b"\x00"


# -- the server's side: pure steps, driven by DataServer's event loop -----------------------
def server_hello(name: str, encrypt: bool) -> tuple[bytes, bytes]:
    """(hello, server nonce): the server's first message."""
    sn = os.urandom(NONCE)
    return MAGIC + bytes([VERSION]) + mode_byte(encrypt) + sn + _name_bytes(name, "server"), sn


def reply_name_length(head: bytes) -> int:
    """The client's name length, from the first :data:`REPLY_HEAD` bytes of its reply."""
    n = head[-1]
    if n == 0:
        raise ProtocolError("the peer gave an empty name")
    return n


def check_reply(key: bytes, hello: bytes, reply: bytes, encrypt: bool) -> bytes:
    """Check a whole client reply against the link's ``key``; the server's answer, or
    :class:`AuthError`."""
    body, proof = reply[:-DIGEST], reply[-DIGEST:]
    if not hmac.compare_digest(proof, _proof(key, b"client", hello, body)):
        raise AuthError("peer failed the data-path challenge (wrong key or not a tracr peer)")
    if reply[:1] != mode_byte(encrypt):
        raise AuthError("peer asked for a different transport.encrypt setting")
    return _proof(key, b"server", hello, reply)


def server_session(key: bytes, hello: bytes, reply: bytes, encrypt: bool) -> Session:
    """The server's session once :func:`check_reply` passed."""
    sn = hello[len(MAGIC) + 2 : len(MAGIC) + 2 + NONCE]
    return derive(key, sn, reply[1 : 1 + NONCE], encrypt)[1]


# -- the client's side -------------------------------------------------------------------------
def client_handshake(
    sock: socket.socket, key: bytes, encrypt: bool, deadline: float, *,
    name: str, partner: str,
) -> Session:
    """Authenticate as ``name`` to the :class:`DataServer` of ``partner`` by ``deadline``,
    check that it holds the link's ``key`` too, and return this side's session."""
    own = _name_bytes(name, "client")
    head = recv_exact(sock, HELLO_HEAD, deadline)
    if head[: len(MAGIC)] != MAGIC:
        raise ProtocolError("the peer is not a tracr data server (bad greeting)")
    if head[len(MAGIC)] != VERSION:
        raise ProtocolError(
            f"the data server speaks handshake version {head[len(MAGIC)]}, this side {VERSION}",
            hint="both participants must run the same tracr version",
        )
    if head[len(MAGIC) + 1 : len(MAGIC) + 2] != mode_byte(encrypt):
        raise AuthError(
            "the data server and this side disagree on transport.encrypt",
            hint="both participants take transport.encrypt from the same manifest",
        )
    if head[-1] == 0:
        raise ProtocolError("the data server gave an empty name")
    said = recv_exact(sock, head[-1], deadline)
    hello = head + said
    if said != _name_bytes(partner, "partner")[1:]:
        raise AuthError(
            f"reached the data server of {decode_name(said)!r}, not of {partner!r}",
            hint="the connection was redirected on the way, or the wiring is wrong",
        )
    sn = head[len(MAGIC) + 2 : len(MAGIC) + 2 + NONCE]
    cn = os.urandom(NONCE)
    body = mode_byte(encrypt) + cn + own
    reply = body + _proof(key, b"client", hello, body)
    _send_by(sock, reply, deadline)
    try:
        answer = recv_exact(sock, DIGEST, deadline)
    except ChannelClosed:
        raise AuthError(
            f"the data server of {partner!r} rejected our proof",
            hint="both sides must hold this link's key (the same run), and the server "
                 "must expect this participant",
        ) from None
    if not hmac.compare_digest(answer, _proof(key, b"server", hello, reply)):
        raise AuthError(f"the data server of {partner!r} could not prove it holds the link's key")
    return derive(key, sn, cn, encrypt)[0]
