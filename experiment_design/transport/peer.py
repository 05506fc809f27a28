"""A stand-alone echo/ack peer for measuring the data path against a raw TCP socket.

``python -m experiment_design.transport.peer`` reads the run secret (hex) from the first
line of stdin, listens on three ports of ``--host`` (data channels with integrity tags,
the same with encryption, raw TCP) and prints one line::

    TRACR-PEER {"data_port": N, "data_port_encrypted": E, "raw_port": M, "pid": P}

On the data port it answers authenticated :class:`DataChannel` messages: ``{"op": "ack"}``
is answered with a small ack frame carrying the peer's receive and decode times,
``{"op": "echo"}`` with the same tensors sent back raw. On the raw port it speaks the
least a TCP receiver can: a 9-byte request (op, length), the payload read with
``recv_into`` into a fresh buffer, then a 1-byte ack (op ``A``) or the payload back (op
``E``). Both sides run the same way in the same process, so the two can be compared
side by side. The peer exits when its stdin closes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import struct
import sys
import threading
from collections.abc import Callable

from experiment_design.transport.auth import recv_exact
from experiment_design.transport.codec import RAW, CodecConfig
from experiment_design.transport.errors import TransportError
from experiment_design.transport.server import DataServer

RAW_REQUEST = struct.Struct("!cQ")
RAW_MAX = 1 << 31
_WAITALL = getattr(socket, "MSG_WAITALL", 0)


def serve_channels(server: DataServer) -> None:
    """Accept data channels forever, one thread each."""
    while True:
        try:
            channel = server.accept()
        except TransportError:
            return
        threading.Thread(target=_answer, args=(channel,), daemon=True).start()


def _answer(channel) -> None:
    with channel:
        while True:
            try:
                header, tensors, stats = channel.recv()
            except TransportError:
                return
            op = header.get("op")
            if op == "ack":
                channel.send({"op": "ack", "recv_ms": stats.recv_ms, "decode_ms": stats.decode_ms})
            elif op == "echo":
                channel.send({"op": "echo"}, tensors, codec=RAW)
            else:
                channel.send({"op": "error", "message": f"unknown op {op!r}"})


def serve_raw(listener: socket.socket) -> None:
    """Accept raw TCP connections forever, one thread each."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_answer_raw, args=(conn,), daemon=True).start()


def _answer_raw(conn: socket.socket) -> None:
    with conn:
        try:
            while True:
                op, n = RAW_REQUEST.unpack(recv_exact(conn, RAW_REQUEST.size))
                if n > RAW_MAX:
                    return
                buf = bytearray(n)
                view = memoryview(buf)
                got = 0
                while got < n:
                    k = conn.recv_into(view[got:], n - got, _WAITALL)
                    if k == 0:
                        return
                    got += k
                conn.sendall(b"\x01" if op == b"A" else view)
        except (TransportError, OSError):
            return


def start(
    host: str, secret: bytes, codec: CodecConfig = RAW
) -> tuple[dict[str, int], Callable[[], None]]:
    """Serve the ports on background threads of this process; returns (ports, stop)."""
    server = DataServer(host, 0, secret, codec)
    encrypted = DataServer(host, 0, secret, dataclasses.replace(codec, encrypt=True))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    raw = socket.create_server((host, 0), family=family)
    threading.Thread(target=serve_channels, args=(server,), daemon=True).start()
    threading.Thread(target=serve_channels, args=(encrypted,), daemon=True).start()
    threading.Thread(target=serve_raw, args=(raw,), daemon=True).start()

    def stop() -> None:
        server.close()
        encrypted.close()
        try:
            raw.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        raw.close()

    return {
        "data_port": server.address[1],
        "data_port_encrypted": encrypted.address[1],
        "raw_port": raw.getsockname()[1],
        "pid": os.getpid(),
    }, stop


def main(argv: list[str] | None = None) -> int:
    """Entry point: serve until stdin closes."""
    parser = argparse.ArgumentParser(prog="python -m experiment_design.transport.peer")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--codec", default="none", help="codec of this side's own sends")
    args = parser.parse_args(argv)
    secret = bytes.fromhex(sys.stdin.readline().strip())
    import torch

    torch.set_num_threads(1)
    info, stop = start(args.host, secret, CodecConfig(codec=args.codec))
    print("TRACR-PEER " + json.dumps(info), flush=True)
    sys.stdin.read()  # returns at EOF: whoever started us is gone or done
    stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
