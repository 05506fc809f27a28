"""Measuring a lab link with real TCP sockets through the shaped veths.

A receiver runs in the destination namespace and a sender in the source namespace
(both ``ip netns exec NS python``, standard library only). First a TCP ping-pong of
small messages gives the round-trip time; then the sender streams for a few seconds
and the receiver times what arrives. The first quarter second is left out of the rate
so the token bucket's initial burst and TCP slow start do not inflate or deflate it.
Each connection opens with a per-probe secret; the receiver ignores any other client.
"""

from __future__ import annotations

import json
import secrets
import statistics
import subprocess
import sys

from experiment_design.errors import TracrError

# Both ends get a fresh random secret on stdin (never on the command line, which any
# local user can read in /proc). The sender opens each connection with it; the receiver
# drops any connection that does not, within a few seconds, so a stray or hostile client
# on the lab subnet can neither take the probe's place nor stall it.
_RECEIVER = r"""
import hmac, json, socket, sys, time
addr, skip = sys.argv[1], float(sys.argv[2])
secret = sys.stdin.readline().strip().encode()
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((addr, 0)); srv.listen(8)
print(srv.getsockname()[1], flush=True)
end = time.monotonic() + 60

def ours():
    while True:                  # accept until the sender's own connection arrives
        left = end - time.monotonic()
        if left <= 0: raise SystemExit("the probe's sender never connected")
        srv.settimeout(left)
        c, _ = srv.accept()
        c.settimeout(3)
        got = b""
        try:
            while len(got) < len(secret):
                d = c.recv(len(secret) - len(got))
                if not d: break
                got += d
        except OSError:
            pass
        if hmac.compare_digest(got, secret):
            c.settimeout(30)
            return c
        c.close()                # a foreign connection: ignored

c = ours(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:                      # ping-pong: echo each 32-byte message
    m = b""
    while len(m) < 32:
        d = c.recv(32 - len(m))
        if not d: break
        m += d
    if len(m) < 32: break
    c.sendall(m)
c.close()
c = ours()
buf = bytearray(1 << 20); total = 0; t0 = None; mark = None; mark_bytes = 0
while True:
    n = c.recv_into(buf)
    now = time.perf_counter()
    if not n: break
    if t0 is None: t0 = now
    total += n
    if mark is None and now - t0 >= skip: mark, mark_bytes = now, total
    last = now
print(json.dumps({"bytes": total, "first": t0, "mark": mark, "mark_bytes": mark_bytes,
                  "last": last if t0 is not None else None}), flush=True)
"""

_SENDER = r"""
import json, socket, sys, time
addr, port, seconds, pings = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
secret = sys.stdin.readline().strip().encode()
s = socket.create_connection((addr, port), timeout=10); s.sendall(secret)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for i in range(pings + 3):
    t = time.perf_counter(); s.sendall(b"p" * 32); got = 0
    while got < 32:
        d = s.recv(32 - got)
        if not d: raise SystemExit("echo closed")
        got += len(d)
    if i >= 3: rtts.append((time.perf_counter() - t) * 1e3)   # 3 warm-up rounds
s.close()
s = socket.create_connection((addr, port), timeout=10); s.sendall(secret)
chunk = memoryview(b"\0" * (256 << 10)); sent = 0; t0 = time.perf_counter()
while time.perf_counter() - t0 < seconds:
    s.sendall(chunk); sent += len(chunk)
s.shutdown(socket.SHUT_WR); s.recv(1); s.close()
print(json.dumps({"rtts_ms": rtts, "sent": sent}), flush=True)
"""


def _netns(ns: str | None, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv] if ns else argv


def measure_link(
    src_ns: str | None,
    dst_ns: str | None,
    dst_address: str,
    *,
    seconds: float = 2.0,
    pings: int = 20,
    skip: float = 0.25,
) -> dict:
    """Rate (TCP payload bytes/s) and round trip (ms) from ``src_ns`` to ``dst_address`` in ``dst_ns``.

    ``None`` for a namespace means the root namespace (the observer).
    """
    py = [sys.executable, "-I", "-c"]
    secret = secrets.token_hex(16)
    recv = subprocess.Popen(
        _netns(dst_ns, [*py, _RECEIVER, dst_address, str(skip)]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        recv.stdin.write(secret + "\n")
        recv.stdin.close()
        recv.stdin = None  # so communicate() below does not touch the closed pipe
        port_line = recv.stdout.readline().strip()
        if not port_line.isdigit():
            raise TracrError(f"link probe receiver did not start: {recv.stderr.read().strip()}")
        send = subprocess.run(
            _netns(src_ns, [*py, _SENDER, dst_address, port_line, str(seconds), str(pings)]),
            input=secret + "\n",
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        )
        if send.returncode != 0:
            raise TracrError(f"link probe sender failed: {send.stderr.strip()[-500:]}")
        out, err = recv.communicate(timeout=30)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    try:
        r = json.loads(out.strip().splitlines()[-1])
        s = json.loads(send.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise TracrError(f"link probe returned nothing useful: {err.strip()[-500:]}") from exc
    if r["mark"] is not None and r["last"] > r["mark"]:
        rate = (r["bytes"] - r["mark_bytes"]) / (r["last"] - r["mark"])
        window = r["last"] - r["mark"]
    else:  # a very short transfer: fall back to the whole of it
        window = max(1e-9, (r["last"] or 0) - (r["first"] or 0))
        rate = r["bytes"] / window
    rtts = s["rtts_ms"]
    return {
        "rate_Bps": rate,
        "rate_window_s": round(window, 3),
        "bytes": r["bytes"],
        "rtt_ms": statistics.median(rtts),
        "rtt_ms_min": min(rtts),
        "rtt_ms_p95": sorted(rtts)[max(0, int(round(0.95 * len(rtts))) - 1)],
        "pings": len(rtts),
        "method": f"tcp payload, steady state after {skip:.2f} s; rtt = median of 32-byte ping-pongs",
    }
