"""The participant process: ``python -m experiment_design.participant --role NAME``.

Prints a heartbeat (``protocol.ALIVE_LINE``) every ``HEARTBEAT_S`` seconds from the
first thing it does until it exits, so a device importing torch for minutes is
visibly alive. Reads the control secret (hex) as the first line of stdin; every
later stdin line is the observer's heartbeat. Serves the role over rpyc on
``--host``/``--port`` behind the HMAC authenticator, prints one
``TRACR-READY {"port": N, "pid": P}`` line (``protocol.Ready``), and exits when stdin
closes, the observer's connection closes, shutdown() is called, or neither a
heartbeat nor a call arrives for ``--idle-timeout`` seconds. On exit it removes
``--workdir`` when ``--cleanup-workdir`` is given.

The heartbeat is started before anything else is imported: the rest of tracr (the roles,
the control server, the allocator and heap settings) and torch are imported inside
:func:`main`, after it, for start-up time on a slow device.

**Who beats.** On Linux a small helper process (:data:`_PULSE`, a ``python -I -S -c``
of a few lines, no torch) writes the heartbeat while this process lives and is not
stopped (``/proc/<pid>/stat``), and dies with it (``PR_SET_PDEATHSIG``). A beat then
needs neither this interpreter's lock nor its share of a slow CPU: a thread's beat
stopped for 30 s on a lab host held to 0.1 core, in a full test suite, and the
participant was declared lost while it worked (a call into C that keeps the lock, such
as a full garbage collection, takes ten times its CPU time in wall time at 0.1 core). A
participant stopped (SIGSTOP), killed, or cut off still falls silent; one stuck inside a
call is ended by the call's own bound (``run.startup_timeout_s``, ``SHORT_CALL_S``). The
heartbeat thread stays as the watch on this interpreter: when it could not run for
:data:`STALL_DUMP_S` it has every thread's stack written to stderr. Elsewhere (no
``/proc``) the thread writes the heartbeat itself.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import shutil
import subprocess
import sys
import threading
import time

from experiment_design.protocol import ALIVE_LINE, HEARTBEAT_S, PARTICIPANT_MODULE, Ready
from experiment_design.registry import PLUGINS_ENV

# run as ``-m`` this module is __main__; its log records keep the module's own name
log = logging.getLogger(PARTICIPANT_MODULE)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of the participant process."""
    p = argparse.ArgumentParser(prog=f"python -m {PARTICIPANT_MODULE}")
    p.add_argument("--role", required=True)
    p.add_argument("--instance", default="")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--workdir", default=None)
    p.add_argument("--cleanup-workdir", action="store_true")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--idle-timeout", type=float, default=30.0,
                   help="exit when neither a heartbeat nor a call arrives for this long")
    # a test hook: a device that takes this long to start (sleeps before importing torch,
    # heartbeats flowing); also read from $TRACR_STARTUP_DELAY_S
    p.add_argument("--startup-delay", type=float,
                   default=float(os.environ.get("TRACR_STARTUP_DELAY_S") or 0),
                   help=argparse.SUPPRESS)
    p.add_argument("--plugins", default=None,
                   help="comma-separated plugin modules to import (a user's own package; "
                        "experiment_design.registry)")
    p.add_argument("--allocator", choices=("steady", "default"), default="steady",
                   help="steady: keep freed memory for the next inference (runtime/allocator.py)")
    return p.parse_args(argv)


class Lifecycle:
    """Owns the exit path: one reason, one cleanup, then the process ends."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.server = None
        self.service = None
        self._once = threading.Lock()
        self.last_heard = time.monotonic()  # the observer's last heartbeat (stdin line)
        self.beats = 0

    def quiet_for(self) -> float:
        """Seconds since the observer was last heard from (a heartbeat or a call)."""
        last = self.last_heard
        if self.service is not None:
            last = max(last, self.service.last_call)
        return time.monotonic() - last

    def exit(self, reason: str, warn: bool = False) -> None:
        """Stop serving, clean up, and end the process (from any thread). ``warn``: an end
        the observer did not ask for, said on stderr (the observer prints a participant's
        stderr; its log buffer goes with the process, and the observer, whose calls now
        fail with a closed connection, could not tell why)."""
        if not self._once.acquire(blocking=False):
            # Another thread is already exiting. Returning from the main thread would start
            # a normal interpreter shutdown (a second or more with torch loaded) that races
            # that thread's cleanup of the workdir; wait for its os._exit instead.
            if threading.current_thread() is threading.main_thread():
                time.sleep(10.0)
                os._exit(0)
            return
        log.log(logging.WARNING if warn else logging.INFO, "participant exiting: %s", reason)
        try:
            if self.service is not None:
                self.service.close()
        except Exception:  # exiting anyway
            pass
        try:
            if self.server is not None:
                self.server.close()
        except Exception:
            pass
        if self.args.workdir and self.args.cleanup_workdir:
            shutil.rmtree(self.args.workdir, ignore_errors=True)
        sys.stdout.flush()
        sys.stderr.flush()
        # daemon threads may sit in torch ops or blocking sockets; do not wait for them
        os._exit(0)


_say_lock = threading.Lock()


def say(line: str) -> None:
    """Write one protocol line on stdout (whole, flushed; heartbeats come from a thread)."""
    with _say_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


STALL_DUMP_S = 5 * HEARTBEAT_S

# The heartbeat helper (see the module's docstring): argv is the participant's pid, the
# period and the line. It beats while the participant is neither gone nor stopped.
_PULSE = """
import os, sys, time
parent, period, line = int(sys.argv[1]), float(sys.argv[2]), (sys.argv[3] + "\\n").encode()
try:
    import ctypes, signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except Exception:
    pass
def state():
    try:
        with open(f"/proc/{parent}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return b"X"
while os.getppid() == parent:
    s = state()
    if s in (b"X", b"x", b"Z"):
        break
    if s not in (b"T", b"t"):
        try:
            os.write(1, line)
        except OSError:
            break
    time.sleep(period)
"""


def start_pulse() -> subprocess.Popen | None:
    """Start the heartbeat helper (Linux: it reads ``/proc``); None where it cannot run."""
    if not os.path.exists(f"/proc/{os.getpid()}/stat"):
        return None
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _PULSE, str(os.getpid()), str(HEARTBEAT_S),
             ALIVE_LINE], stdin=subprocess.DEVNULL, close_fds=True)
    except OSError:
        return None


def _heartbeat(pulse: subprocess.Popen | None = None) -> None:
    """Watch this interpreter every ``HEARTBEAT_S``, and print the heartbeat unless the
    helper ``pulse`` does (or once it has ended). A thread needs the interpreter lock to
    run, so a thread that holds it (a long call into C that does not let go of it), or a
    process that gets no CPU, holds this one up. If it does not run for ``STALL_DUMP_S``,
    faulthandler's own thread (which needs no lock) writes every thread's stack to
    stderr, where the observer keeps it (a lost participant's error quotes it): the stack
    shows what held it."""
    last = time.monotonic()
    while True:
        try:
            faulthandler.dump_traceback_later(STALL_DUMP_S, file=sys.stderr)  # re-armed
            if pulse is None or pulse.poll() is not None:  # poll() also reaps it
                say(ALIVE_LINE)
        except (OSError, ValueError):  # stdout gone: the observer is gone, stdin will say so
            faulthandler.cancel_dump_traceback_later()
            return
        time.sleep(HEARTBEAT_S)
        now = time.monotonic()
        if now - last > STALL_DUMP_S:
            helped = pulse is not None and pulse.poll() is None
            print(f"participant: the interpreter was held for {now - last - HEARTBEAT_S:.1f} s"
                  f" ({'the heartbeat helper beat meanwhile' if helped else 'no heartbeat'})",
                  file=sys.stderr, flush=True)
        last = now


def _watch_stdin(life: Lifecycle) -> None:
    try:
        while sys.stdin.readline():
            life.last_heard = time.monotonic()  # any line is the observer's heartbeat
            life.beats += 1
    except (OSError, ValueError):
        pass
    life.exit("stdin closed (observer gone)")


def _watch_idle(life: Lifecycle, idle_s: float) -> None:
    """End the participant when the observer has been silent for ``idle_s``. The silence
    is judged only after a sleep that ended on time: a watch that woke late was held (the
    interpreter lock kept by a call into C, or no CPU for the process), and so was the
    thread that reads the observer's heartbeats, whose lines wait unread in the pipe.
    Judged at once, the observer's heartbeats of the whole hold were counted as silence:
    a participant on a lab host held to 0.1 core, importing torch with the lock held for
    38 s, ended itself with "no heartbeat ... for 30 s" while the observer beat every 2 s.
    """
    period = min(1.0, idle_s / 4)
    while True:
        t0 = time.monotonic()
        time.sleep(period)
        if time.monotonic() - t0 > 2 * period:
            continue  # held: the heartbeat reader gets its turn in the next sleep
        service = life.service
        if service is None and not life.beats:
            # still starting, for an observer that drives us by calls only: its idle
            # clock starts when we are ready to be called (the role sets last_call then)
            continue
        if service is not None and service.busy() and not life.beats:
            # an observer that drives us by calls only (a script, a test) and waits for
            # this long one; one that sends heartbeats is lost when they stop, busy or not
            continue
        if life.quiet_for() > idle_s:
            life.exit(f"no heartbeat or call from the observer for {idle_s:.0f} s", warn=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    pulse = start_pulse()
    threading.Thread(target=_heartbeat, args=(pulse,), daemon=True, name="heartbeat").start()
    args = parse_args(argv)
    if args.plugins:
        os.environ[PLUGINS_ENV] = args.plugins  # the registries import them on lookup
    secret_line = sys.stdin.readline().strip()
    if not secret_line:
        print("participant: expected the control secret (hex) on stdin", file=sys.stderr)
        return 2
    secret = bytes.fromhex(secret_line)
    life = Lifecycle(args)
    threading.Thread(target=_watch_stdin, args=(life,), daemon=True, name="stdin-watch").start()
    threading.Thread(
        target=_watch_idle, args=(life, args.idle_timeout), daemon=True, name="idle-watch"
    ).start()
    if args.startup_delay > 0:
        time.sleep(args.startup_delay)

    from experiment_design.runtime import heap
    from experiment_design.runtime.allocator import configure

    configure(args.allocator)
    heap.activate()

    from experiment_design.runtime.logcapture import LogBuffer

    buffer = LogBuffer()
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    root.addHandler(buffer)
    stderr_handler = logging.StreamHandler(sys.stderr)
    stderr_handler.setLevel(logging.WARNING)
    root.addHandler(stderr_handler)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from experiment_design.roles import get_role
    from experiment_design.runtime.auth import control_server

    role_cls = get_role(args.role)
    service = role_cls(instance=args.instance, threads=args.threads, logs=buffer, on_exit=life.exit)
    life.service = service
    rpyc_log = logging.getLogger("experiment_design.runtime.rpyc")
    rpyc_log.setLevel(logging.WARNING)  # rpyc's per-connection chatter is not run news
    server = control_server(service, secret, args.host, args.port, logger=rpyc_log)
    life.server = server
    port = server.port
    say(Ready(port=port, pid=os.getpid()).line())
    log.info("role %s listening on %s:%s (threads=%s)", args.role, args.host, port,
             torch.get_num_threads())
    try:
        server.start()
    except (KeyboardInterrupt, SystemExit):
        pass
    life.exit("server stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
