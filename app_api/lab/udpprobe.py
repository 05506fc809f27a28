"""UDP measurements of one lab link direction: round trip, message goodput and loss.

A receiver runs where the traffic goes (a host's namespace, or the root namespace for the
observer) and a sender where it comes from, both ``python -I -c`` with the standard
library only. Every datagram starts with an 8-byte per-probe token that comes on stdin
(never on the command line); the receiver ignores any other datagram. Kinds:

- ``P``: a ping, echoed back; the sender times the round trip on its own clock. The
  receiver, and the sender while it pings, run at a real-time priority (SCHED_FIFO 30,
  below the link emulator's 40) where they may, so what else the CPUs run does not
  add its wait to the round trip: the probe measures the link, not the scheduler.
- ``D``: message data (message id, index), 1472-byte datagrams (a full 1514-byte frame).
- ``L``: loss probe, small datagrams paced below the link's rate so no queue drops any.
- ``E``: the end; the receiver prints what it saw (wall-clock arrival times) and exits.

Both ends have deadlines: the receiver stops at ``deadline_s`` whatever it got, the sender
waits at most ``ping_timeout_s`` for an echo, and the parent kills both after that.
"""

from __future__ import annotations

import json
import math
import secrets
import subprocess
import sys

from experiment_design.errors import TracrError

DATAGRAM = 1472  # UDP payload of one full frame: 1500 - 20 (IP) - 8 (UDP)
FRAME = 1514  # its frame on the wire
LOSS_PAYLOAD = 64

_RECEIVER = r"""
import json, os, select, socket, struct, sys, time
addr, deadline_s = sys.argv[1], float(sys.argv[2])
token = bytes.fromhex(sys.stdin.readline().strip())
try:  # echo at once, whatever else is runnable here (it only waits on its socket)
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(30))
except (OSError, AttributeError):
    pass
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
s.setsockopt(socket.SOL_SOCKET, 35, 1)  # SO_TIMESTAMPNS: the kernel's arrival time
s.bind((addr, 0))
print(s.getsockname()[1], flush=True)
end = time.monotonic() + deadline_s
msgs, loss = {}, {}
while True:
    left = end - time.monotonic()
    if left <= 0 or not select.select([s], [], [], left)[0]:
        break
    data, anc, _, peer = s.recvmsg(65536, 64)
    t = time.time()
    for level, kind, value in anc:
        if level == socket.SOL_SOCKET and kind == 35 and len(value) >= 16:
            sec, nsec = struct.unpack("qq", value[:16])
            t = sec + nsec * 1e-9
    if data[:8] != token:
        continue
    kind = data[8:9]
    if kind == b"P":
        s.sendto(data, peer)
    elif kind == b"D":
        mid, idx = struct.unpack("!II", data[9:17])
        msgs.setdefault(mid, []).append((idx, t, len(data)))
    elif kind == b"L":
        mid, seq = struct.unpack("!II", data[9:17])
        loss.setdefault(mid, set()).add(seq)
    elif kind == b"E":
        break
print(json.dumps({"msgs": msgs, "loss": {k: len(v) for k, v in loss.items()}}), flush=True)
"""

_SENDER = r"""
import json, os, select, socket, struct, sys, time
addr, port = sys.argv[1], int(sys.argv[2])
try:
    os.nice(-10)  # ahead of ordinary work on a busy machine: a stalled sender idles the link
except OSError:
    pass
token = bytes.fromhex(sys.stdin.readline().strip())
plan = json.loads(sys.stdin.readline())
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
s.connect((addr, port))
out = {"rtts_ms": [], "ping_lost": 0, "sent": {}, "loss_sent": {}}

def paced(n, size, kind, mid, rate, burst=0):
    # n datagrams of size bytes at rate bytes/s (0: as fast as the socket takes them), the
    # first burst of them at once: a backlog in the link's queue that a stall of this
    # process (page faults as it starts, other work) does not drain
    pad = b"\0" * (size - 17)
    t0 = time.perf_counter()
    for i in range(n):
        if rate and i >= burst:
            due = t0 + (i - burst) * (size + 42) / rate
            while True:
                ahead = due - time.perf_counter()
                if ahead <= 0:
                    break
                time.sleep(ahead if ahead > 0.002 else 0)
        try:
            s.send(token + kind + struct.pack("!II", mid, i) + pad)
        except OSError:
            pass

s.settimeout(plan["ping_timeout_s"])
try:  # the pings only wait on the socket: time them at a real-time priority, then drop it
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(30))
    realtime = True
except (OSError, AttributeError):
    realtime = False
out["ping_realtime"] = realtime
wait_s, spin_s = plan.get("ping_wait_s", 0.0), plan.get("ping_spin_s", 0.0)
for i in range(plan["pings"]):
    want = struct.pack("!II", 0, i)
    t = time.perf_counter()
    try:
        s.send(token + b"P" + want)
        got = False
        if wait_s > 0:  # no echo comes before the link's delay; one that does wakes this
            select.select([s], [], [], wait_s)
        # then poll, yielding to the echo's receiver if it shares this CPU: an echo that
        # comes within spin_s is timed without this process's own wake-up in it
        s.setblocking(False)
        end = time.perf_counter() + spin_s
        while not got and time.perf_counter() < end:
            try:
                got = s.recv(64)[9:17] == want
            except BlockingIOError:
                os.sched_yield()
        s.settimeout(plan["ping_timeout_s"])
        while not got:
            got = s.recv(64)[9:17] == want
        out["rtts_ms"].append((time.perf_counter() - t) * 1e3)
    except OSError:
        out["ping_lost"] += 1
        s.settimeout(plan["ping_timeout_s"])
    time.sleep(plan.get("ping_gap_s", 0.005))
if realtime:  # the paced sends below spin: never at a real-time priority
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
for mid, (size, drain) in enumerate(zip(plan["messages"], plan["drain_s"]), 1):
    n = -(-size // 1472)
    paced(n, 1472, b"D", mid, plan["pace_Bps"], plan.get("burst", 0))
    out["sent"][mid] = n
    time.sleep(drain)
for mid, (n, rate) in enumerate(plan["loss"], 1):
    paced(n, 64, b"L", mid, rate)
    out["loss_sent"][mid] = n
time.sleep(plan["end_wait_s"])
for _ in range(5):
    try:
        s.send(token + b"E" + b"\0" * 8)
    except OSError:  # the receiver has ended (the ICMP of an earlier end)
        break
    time.sleep(0.02)
print(json.dumps(out), flush=True)
"""


def _netns(ns: str | None, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv] if ns else argv


def session(src_ns: str | None, dst_ns: str | None, dst_address: str, plan: dict,
            timeout_s: float) -> dict:
    """Run one sender/receiver pair with ``plan`` (see ``_SENDER``); both outputs merged.

    ``plan``: pings, ping_timeout_s, messages (bytes each), drain_s (a wait after each),
    pace_Bps (0: unpaced), burst (datagrams sent at once before the pacing), loss ([(datagrams, bytes/s)]), end_wait_s.
    """
    py = [sys.executable, "-I", "-c"]
    token = secrets.token_hex(8)
    recv = subprocess.Popen(_netns(dst_ns, [*py, _RECEIVER, dst_address, str(timeout_s)]),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        recv.stdin.write(token + "\n")
        recv.stdin.close()
        recv.stdin = None
        port = recv.stdout.readline().strip()
        if not port.isdigit():
            raise TracrError(f"the UDP probe's receiver did not start: "
                             f"{recv.stderr.read().strip()[-300:]}")
        send = subprocess.run(_netns(src_ns, [*py, _SENDER, dst_address, port]),
                              input=token + "\n" + json.dumps(plan) + "\n",
                              capture_output=True, text=True, timeout=timeout_s + 10)
        if send.returncode != 0:
            raise TracrError(f"the UDP probe's sender failed: {send.stderr.strip()[-300:]}")
        out, err = recv.communicate(timeout=timeout_s + 10)
    except subprocess.TimeoutExpired:
        raise TracrError(f"the UDP probe to {dst_address} did not finish within "
                         f"{timeout_s + 10:.0f} s (is the link emulator alive? "
                         "'tracr lab ls')") from None
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    try:
        got = json.loads(out.strip().splitlines()[-1])
        sent = json.loads(send.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise TracrError(f"the UDP probe returned nothing useful: {err.strip()[-300:]}") from exc
    return {**sent, **got}


def skip_count(n: int, rate_Bps: float | None) -> int:
    """How many of a message's ``n`` datagrams to leave out of its goodput: a tenth, and at
    least what the link sends in 3 ms (tbf lets its bucket, 2 ms of traffic, through at
    once), keeping 3 at least."""
    burst = math.ceil(0.003 * rate_Bps / FRAME) if rate_Bps else 0
    return max(1, min(max(int(0.1 * n), burst), n - 4))


def message_goodput(arrivals: list, skip: int) -> float | None:
    """Payload bytes/s of one message from its datagrams' arrivals ``[(index, t, bytes)]``
    (kernel receive times): from the ``skip``-th arrival to the last, so a shaper's
    initial burst does not count. None with too few datagrams."""
    rows = sorted(arrivals, key=lambda r: r[1])
    k = max(1, skip)
    if len(rows) - k < 3:
        return None
    span = rows[-1][1] - rows[k - 1][1]
    return sum(r[2] for r in rows[k:]) / span if span > 0 else None
