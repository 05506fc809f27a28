"""The link probe measures only its own connection: foreign clients are ignored."""

from __future__ import annotations

import socket
import threading
import time

from app_api.lab.probe import measure_link

ADDR = "127.0.0.77"  # the whole 127/8 is loopback: an address only this test listens on


def _listening_port(addr: str) -> int | None:
    want = "".join(f"{int(b):02X}" for b in reversed(addr.split(".")))
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            host, port = local.split(":")
            if host == want and state == "0A":  # LISTEN
                return int(port, 16)
    return None


def _intruder(stop: threading.Event, made: list[str], held: list[socket.socket]) -> None:
    """Connect to the probe's receiver as soon as it listens, again and again."""
    port = None
    while port is None and not stop.is_set():
        port = _listening_port(ADDR)
    kinds = ["junk", "silent", "wrong-secret"]
    while not stop.is_set() and len(made) < 12:
        kind = kinds[len(made) % len(kinds)]
        try:
            c = socket.create_connection((ADDR, port), timeout=1)
        except OSError:
            time.sleep(0.01)
            continue
        made.append(kind)
        if kind == "junk":
            c.sendall(b"p" * 32)  # looks like a ping: today's receiver echoes it
            c.close()
        elif kind == "wrong-secret":
            c.sendall(b"0" * 32 + b"p" * 32)
            c.close()
        else:
            held.append(c)  # says nothing and stays open
        time.sleep(0.05)


def test_probe_ignores_foreign_connections():
    stop, made, held = threading.Event(), [], []
    t = threading.Thread(target=_intruder, args=(stop, made, held), daemon=True)
    t.start()
    try:
        result = measure_link(None, None, ADDR, seconds=0.5, pings=5)
    finally:
        stop.set()
        t.join(5)
        for c in held:
            c.close()
    assert made, "the intruder never got a connection in"
    assert result["pings"] == 5
    assert result["bytes"] > 1_000_000  # the sender's stream, not an intruder's 32 bytes
    assert result["rate_Bps"] > 1e6 and 0 < result["rtt_ms"] < 100
