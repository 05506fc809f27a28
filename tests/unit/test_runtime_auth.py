"""The control channel: rpyc behind the HMAC challenge, safe protocol config."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time

import pytest

from experiment_design.roles import ParticipantService
from experiment_design.runtime import connect_control
from experiment_design.runtime.auth import PROTOCOL_CONFIG, control_server


@pytest.fixture
def server():
    secret = os.urandom(32)
    svc = ParticipantService(instance="t")
    srv = control_server(svc, secret)
    t = threading.Thread(target=srv.start, daemon=True)
    t.start()
    yield srv, secret
    srv.close()
    t.join(5)


def test_safe_protocol_config():
    assert PROTOCOL_CONFIG["allow_pickle"] is False
    assert PROTOCOL_CONFIG["allow_public_attrs"] is False
    assert PROTOCOL_CONFIG["sync_request_timeout"] >= 300


def test_right_token_gets_rpc(server):
    srv, secret = server
    conn = connect_control("127.0.0.1", srv.port, secret)
    try:
        assert json.loads(conn.root.heartbeat()) == "ok"
        st = json.loads(conn.root.poll("{}"))
        assert st["state"] == "idle" and st["records"] == []
        with pytest.raises(AttributeError):
            conn.root.touch  # noqa: B018 - not exposed
    finally:
        conn.close()


def test_wrong_token_is_rejected(server):
    srv, _ = server
    with pytest.raises(ConnectionError):
        connect_control("127.0.0.1", srv.port, os.urandom(32), timeout=3)


def test_raw_rpyc_without_token_gets_nothing(server):
    srv, _ = server
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=3)
    try:
        s.recv(40)  # the greeting and nonce
        s.sendall(b"\x00" * 64)  # garbage answer
        assert s.recv(64) == b""  # closed before any rpyc frame
    finally:
        s.close()


def _impostor(speak) -> tuple[socket.socket, threading.Thread]:
    """A control port run by someone without the secret: ``speak(conn)`` does its best."""
    listener = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            try:
                speak(conn)
                conn.recv(1 << 16)  # then keep the line open, as an rpyc server would
            except OSError:
                pass

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return listener, t


def _old_style(conn: socket.socket) -> None:
    conn.sendall(os.urandom(32))  # a nonce
    conn.recv(32)  # whatever the observer answers
    conn.sendall(b"TRACR-OK\n")  # "fine by me"


def _new_style_wrong_secret(conn: socket.socket) -> None:
    from experiment_design.runtime.auth import MAGIC

    conn.sendall(MAGIC + os.urandom(32))
    conn.recv(64)
    conn.sendall(os.urandom(32))  # a proof it cannot compute


@pytest.mark.parametrize("speak", [_old_style, _new_style_wrong_secret])
def test_the_observer_refuses_a_control_server_without_the_secret(speak):
    listener, t = _impostor(speak)
    try:
        with pytest.raises(ConnectionError):
            conn = connect_control("127.0.0.1", listener.getsockname()[1], os.urandom(32),
                                   timeout=2)
            conn.close()  # reached only when the impostor was believed
    finally:
        listener.close()
        t.join(5)


def test_a_flood_of_unauthenticated_connections_is_capped(server):
    srv, secret = server
    before = threading.active_count()
    flood = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(100)]
    try:
        time.sleep(1.0)  # let the server accept them all
        grown = threading.active_count() - before
        assert grown <= 20, f"{grown} threads for 100 silent connections"
    finally:
        for s in flood:
            s.close()
    conn = connect_control("127.0.0.1", srv.port, secret, timeout=10)  # still serves
    try:
        assert json.loads(conn.root.heartbeat()) == "ok"
    finally:
        conn.close()


def _reset_right_away(port: int) -> None:
    """Connect, then close with SO_LINGER 0: the peer gets a RST, not a FIN."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def test_connections_reset_before_authentication_do_not_leak_pending_slots():
    """rpyc reads the peer's address before the authenticator runs; a connection reset
    by then used to keep its pending slot for good, and 16 of them locked even the
    observer out."""
    secret = os.urandom(32)
    srv = control_server(ParticipantService(instance="t"), secret, max_pending=4)
    for _ in range(12):  # queued before the server accepts: reset while in the backlog
        _reset_right_away(srv.port)
    time.sleep(0.2)
    t = threading.Thread(target=srv.start, daemon=True)
    t.start()
    try:
        for _ in range(12):  # and some while it is running
            _reset_right_away(srv.port)
        deadline = time.monotonic() + 5
        while srv.pending and time.monotonic() < deadline:
            time.sleep(0.02)
        assert srv.pending == 0
        conn = connect_control("127.0.0.1", srv.port, secret, timeout=5)
        try:
            assert json.loads(conn.root.heartbeat()) == "ok"
        finally:
            conn.close()
    finally:
        srv.close()
        t.join(5)
