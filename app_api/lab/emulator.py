"""The lab's link emulator: a process that delays, drops and paces every host's frames.

Used where the kernel has no ``netem`` qdisc, for trace-driven links, and whenever
``--link-mode user`` asks for it (see :func:`app_api.lab.network.choose_mechanism`). In
the way Mahimahi does, the lab's traffic passes through this user-space process, so it
needs no kernel module. Host i's veth (``trlab-<i>h``, root end) leaves the bridge; a
second veth pair ``trlab-<i>x`` / ``trlab-<i>y`` has ``y`` on the bridge, and the emulator
relays Ethernet frames between ``h`` and ``x`` with AF_PACKET sockets::

    [netns] trlab-<i>n <-> trlab-<i>h  ==emulator==  trlab-<i>x <-> trlab-<i>y -- bridge

Frames from ``h`` (the host's egress) go through the host's ``up`` pipe, frames from ``x``
through its ``down`` pipe (:class:`app_api.lab.pipe.Pipe`: loss, queue, rate, delay).
Every veth end has segmentation and checksum offloads off, so every frame is at most
1514 bytes and carries a full checksum.

**Timing.** The process runs at a real-time priority (SCHED_FIFO 40, below the CPU pacer's
50) so lab hosts busy on every CPU do not delay it, and it waits in ``select`` with a
microsecond timeout (timer slack 1 ns); ``epoll`` would round every wait up to a whole
ms. It asks to wake earlier by select's usual lateness (tracked as it goes; 60-100 us
in this VM) and sends every frame due within :data:`EARLY_S`, so frames leave within
tens of us of their time without spinning: spinning for the last 150 us before each
frame held frames to 4-8 us but, at 100 Mbit/s, where a frame leaves every 121 us,
took 0.9 of a core. The delay counts from the kernel's arrival time of each frame.

One exception: once frames have come in and none are held, the process polls for
:data:`SPIN_S` before it sleeps. A request is usually answered within that time, and the
answer then finds the process awake: waking it from ``select`` cost 70-90 us per relayed
frame in this VM. A ping's round trip through an unshaped user link fell from 0.36 to
0.275 ms (the kernel's path without the emulator: 0.225 ms); the emulator's CPU time
for 600 pings rose from 0.12 to 0.24 s. A held frame, as in any bulk transfer, ends the
polling, so a busy link costs no more than before.

**Timeline.** Whenever a direction's configured state changes (start, a reconfiguration
by SIGHUP, each step of a trace) a JSON line goes to the timeline file (wall time
``time.time()``); :func:`app_api.lab.timeline.link_timeline` reads it.

**Ending.** On SIGTERM/SIGINT, or once the lab's state file is gone, the process exits.
If it dies, the lab's hosts are cut off (nothing else relays their frames): ``tracr lab
ls`` says so, and :func:`app_api.lab.health.lab_health` names it for a run.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from collections import deque
from pathlib import Path

from app_api.lab.pipe import LinkConfig, Pipe
from app_api.lab.system import find_helpers, helper_is_ours, start_helper

READY = "relaying from emulator"  # logged once every socket is open
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
PACKET_IGNORE_OUTGOING = 23
SOL_PACKET = 263
SO_RCVBUFFORCE = 33
SO_TIMESTAMPNS = 35
EARLY_S = 30e-6  # frames due this soon are sent now
_LAG_S, _LAG_MAX_S = 60e-6, 500e-6  # select's lateness: first guess and cap
_CHECK_S = 1.0  # how often the lab's state file is looked for
_MAX_WAIT_S = 0.5
_PRIORITY = 40
SPIN_S = 200e-6  # after frames come in and none are held, poll this long before sleeping


class Direction:
    """One direction of one host's link: its pipe and the frames in flight."""

    def __init__(self, host: str, name: str, config: LinkConfig, out: socket.socket,
                 epoch: float, seed: int) -> None:
        self.host, self.name, self.out = host, name, out
        self.frames: deque[tuple[float, bytes]] = deque()
        self.sent = 0
        self.late = 0.0  # how late held frames went out, in all (for the stats file)
        self.late_n = 0
        self.configure(config, epoch, seed)

    def configure(self, config: LinkConfig, epoch: float, seed: int) -> None:
        self.config = config
        self.pipe = None if config.is_empty() else Pipe(config, epoch, seed)
        self.steps = []
        self.step_i = 0
        sched = self.pipe.schedule if self.pipe else None
        if sched is not None and sched.period is not None:
            self.steps = sched.steps()
            self.period = sched.period
        self.epoch = epoch

    def take(self, now: float, frame: bytes) -> None:
        if self.pipe is None:
            self.send(frame)
            return
        when = self.pipe.offer(now, len(frame))
        if when is not None:
            self.frames.append((when, frame))

    def send(self, frame: bytes) -> None:
        try:
            self.out.send(frame)
            self.sent += 1
        except OSError:  # ENOBUFS and the like: the frame is lost, as on a full NIC
            pass


def _open(ifname: str) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    try:
        s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    except OSError:
        pass  # older kernels: outgoing copies are skipped by their packet type instead
    try:
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 32 << 20)
    except OSError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    s.bind((ifname, ETH_P_ALL))
    s.setblocking(False)
    return s


def _realtime() -> None:
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(_PRIORITY))
    except (OSError, AttributeError):
        try:
            os.nice(-20)
        except OSError:
            pass
    try:  # PR_SET_TIMERSLACK: wake at the asked microsecond, not up to 50 us later
        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Timeline:
    """Appends the links' configured state to the timeline file, one JSON line each."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.offset = time.time() - time.monotonic()  # monotonic -> wall time

    def write(self, d: Direction, event: str, at: float, rate: float | None = None) -> None:
        if self.path is None:
            return
        c = d.config
        row = {"t": round(at + self.offset, 6), "link": d.host, "dir": d.name, "event": event,
               "mechanism": "user",
               "rate_Bps": rate if rate is not None else c.rate_Bps, "delay_ms": c.delay_ms,
               "jitter_ms": c.jitter_ms, "loss": c.mean_loss(), "trace": c.trace,
               "queue_bytes": c.queue_bytes, "queue_packets": c.queue_packets,
               "epoch": round(d.epoch + self.offset, 6)}
        if c.ge:
            row["ge"] = list(c.ge)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")

    def steps_due(self, d: Direction, now: float) -> None:
        """Write every trace step of ``d`` that began by ``now``."""
        while d.steps:
            loops, i = divmod(d.step_i, len(d.steps))
            at = d.epoch + loops * d.period + d.steps[i][0]
            if at > now:
                return
            self.write(d, "step", at, d.steps[i][1])
            d.step_i += 1


def load_config(path: Path) -> list[dict]:
    """The emulator's links: ``[{host, host_if, bridge_if, up: {...}, down: {...}}]``."""
    return json.loads(Path(path).read_text())["links"]


def run(config_path: Path, timeline_path: Path | None, alive: Path | None) -> None:
    """Relay frames until a signal or ``alive`` disappearing (see the module's docstring)."""
    stop: list[int] = []
    reload: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    signal.signal(signal.SIGHUP, lambda *_: reload.append(1))
    _realtime()
    timeline = Timeline(timeline_path)
    stats_path = timeline_path.with_name("emulator-stats.json") if timeline_path else None
    links = load_config(config_path)
    now = time.monotonic()
    readers: dict[int, tuple[socket.socket, Direction]] = {}
    dirs: dict[tuple[str, str], Direction] = {}
    for n, link in enumerate(links):
        sh, sx = _open(link["host_if"]), _open(link["bridge_if"])
        up = Direction(link["host"], "up", LinkConfig.from_dict(link["up"]), sx, now, 2 * n)
        down = Direction(link["host"], "down", LinkConfig.from_dict(link["down"]), sh, now,
                         2 * n + 1)
        readers[sh.fileno()] = (sh, up)
        readers[sx.fileno()] = (sx, down)
        dirs[(link["host"], "up")], dirs[(link["host"], "down")] = up, down
    for d in dirs.values():
        timeline.write(d, "start", now)
    print(f"{READY} {os.getpid()}: {len(links)} link(s)", file=sys.stderr, flush=True)
    fds = list(readers)
    check = now + _CHECK_S
    recv = [(s, d, s.recvmsg) for s, d in readers.values()]
    # the kernel's arrival time (wall clock) -> monotonic; re-read every _CHECK_S
    offset = time.time() - time.monotonic()
    unpack = struct.Struct("qq").unpack_from
    lag = _LAG_S  # how much later than asked select returns (tracked)
    spin_until = 0.0
    while not stop:
        now = time.monotonic()
        wait = _MAX_WAIT_S
        due = now + EARLY_S
        for d in dirs.values():
            q = d.frames
            while q and q[0][0] <= due:
                when, frame = q.popleft()
                d.send(frame)
                d.late += now - when
                d.late_n += 1
            if q:
                wait = min(wait, q[0][0] - now)
            if d.steps:
                timeline.steps_due(d, now)
        # wake early by select's usual lateness, and send what is due within EARLY_S:
        # frames go out within tens of us of their time without spinning between them
        timeout = max(0.0, wait - EARLY_S - lag)
        if now < spin_until and not any(d.frames for d in dirs.values()):
            timeout = 0.0
        ready = select.select(fds, [], [], timeout)[0]
        if not ready and timeout > 0:
            late = time.monotonic() - now - timeout
            lag = min(_LAG_MAX_S, max(0.0, 0.9 * lag + 0.1 * late))
        if ready:
            now = time.monotonic()
            spin_until = now + SPIN_S
            for s, d, rf in recv:
                if s.fileno() not in ready:
                    continue
                if d.pipe is None:  # a direction that does nothing: relay at once
                    _relay(s, d)
                    continue
                for _ in range(256):  # drain, but let the other sockets have a turn
                    try:
                        frame, anc, _, addr = rf(65536, 64)
                    except BlockingIOError:
                        break
                    except OSError:  # ENETDOWN after a link flap: reported once, no frame
                        continue
                    if addr[2] != PACKET_OUTGOING:
                        # the delay counts from when the frame arrived, not from when this
                        # loop woke up for it (20-80 us later)
                        at = now
                        if anc and len(anc[0][2]) >= 16:
                            sec, nsec = unpack(anc[0][2])
                            at = min(now, sec + nsec * 1e-9 - offset)
                        d.take(at, frame)
        if reload:
            reload.clear()
            _reconfigure(config_path, dirs, timeline)
        if now >= check:
            check = now + _CHECK_S
            offset = time.time() - time.monotonic()
            _write_stats(stats_path, dirs)
            if alive is not None and not alive.exists():
                return


def _relay(s: socket.socket, d: Direction) -> None:
    """Pass a socket's waiting frames straight on (no timestamps, no pipe): the cheap path
    for a direction that does nothing to its frames (by default every host's ingress)."""
    recv, send = s.recvfrom, d.out.send
    for _ in range(256):
        try:
            frame, addr = recv(65536)
        except BlockingIOError:
            return
        except OSError:
            continue
        if addr[2] != PACKET_OUTGOING:
            try:
                send(frame)
                d.sent += 1
            except OSError:
                pass


def _write_stats(path: Path | None, dirs: dict) -> None:
    """Per direction: frames offered, lost, dropped by the queue, sent, and how late held
    frames went out on average (us); read by ``tracr lab verify``."""
    if path is None:
        return
    rows = {f"{h}:{n}": {**(d.pipe.counts if d.pipe else {}), "sent": d.sent,
                         "late_us": round(1e6 * d.late / d.late_n, 1) if d.late_n else None}
            for (h, n), d in dirs.items()}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"t": time.time(), "directions": rows}))
    os.replace(tmp, path)


def _reconfigure(config_path: Path, dirs: dict, timeline: Timeline) -> None:
    now = time.monotonic()
    for n, link in enumerate(load_config(config_path)):
        for k, name in enumerate(("up", "down")):
            d = dirs.get((link["host"], name))
            if d is None:
                continue  # a host added after start needs a new emulator
            d.configure(LinkConfig.from_dict(link[name]), now, 2 * n + k)
            timeline.write(d, "config", now)


_ENTRY = "import sys; from app_api.lab.emulator import main; sys.exit(main(sys.argv[1:]))"


def start(config_path: Path, timeline_path: Path, alive: Path, log_path: Path) -> int:
    """Start the emulator in its own session; its PID (wait for :data:`READY` in the log)."""
    return start_helper([sys.executable, "-c", _ENTRY, "--config", str(config_path),
                         "--timeline", str(timeline_path), "--alive", str(alive)], log_path)


def is_ours(pid: int | None, alive: Path) -> bool:
    """True if ``pid`` is an emulator started for the lab whose state file is ``alive``."""
    return helper_is_ours(pid, _ENTRY, alive)


def find(alive: Path) -> list[int]:
    """PIDs of every emulator of the lab whose state file is ``alive`` (for a lost state)."""
    return find_helpers(_ENTRY, alive)


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) the process ``pid`` has used, or None if it is gone."""
    try:
        with open(f"/proc/{int(pid)}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tracr-lab-emulator",
                                 description="relay lab frames through emulated links")
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--timeline", type=Path, default=None)
    ap.add_argument("--alive", type=Path, default=None,
                    help="exit once this file is gone")
    args = ap.parse_args(argv)
    run(args.config, args.timeline, args.alive)
    return 0
