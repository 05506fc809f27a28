"""The control channel: rpyc behind the HMAC challenge, safe protocol config."""

from __future__ import annotations

import json
import os
import socket
import threading

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
