"""Zero-deploy over SSH: a participant in a temporary venv on a paired device.

One SSH invocation per participant does the whole deploy: it connects (host
key checked against tracr's known_hosts), becomes the ControlMaster for this
participant, and runs the bootstrap, which reads the bundle from stdin into a
fresh ``/tmp/tracr-XXXXXXXX``, makes a venv that reuses the device's torch,
and execs the participant bound to the device's loopback inside a ``sh``
wrapper that removes the dir however python ends. The observer then reads
the ready line (:class:`experiment_design.protocol.Ready`) and adds a local
port forward to the participant's rpyc port through the same master
(``ssh -O forward``: no new login). The session's
stdin stays open: if the observer dies, ssh dies, stdin hits EOF and the
participant exits by itself.

The launched :class:`SSHParticipant` owns the ssh session (its ControlMaster
socket and the port forward through it), the remote process and the remote
temp dir, and :meth:`SSHParticipant.stop` unwinds them in that order's reverse.
The sibling of :mod:`app_api.launch.local` over :mod:`app_api.launch.base`; what its
failures mean is said by :mod:`app_api.launch.ssh_errors`.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import queue
import secrets
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from app_api.devices import ssh, wheels
from app_api.devices.registry import Device, get_device
from app_api.launch.base import (
    Launcher,
    ParticipantHandle,
    ParticipantSpec,
    drop_connection,
    startup_error,
)
from app_api.launch.bundle import (
    BOOT_PREFIX,
    NEED_PREFIX,
    bootstrap_command,
    build_bundle,
    bundle_header,
    wheels_payload,
)
from app_api.launch.remote import control_dir, free_local_port, remote_leftovers
from app_api.launch.ssh_errors import boot_error, cut_off, deploy_error
from experiment_design.errors import TracrError
from experiment_design.protocol import ALIVE_LINE, PARTICIPANT_MODULE, Ready
from experiment_design.registry import plugin_modules
from experiment_design.runtime import connect_control

log = logging.getLogger(__name__)

#: before the participant's first heartbeat (ssh login, unpacking, the venv) the device
#: says nothing; it may stay silent this long (or the liveness timeout, if longer)
BOOT_SILENCE_S = 120.0
_EOF = object()


class SSHParticipant(ParticipantHandle):
    """A participant running in a temporary venv on a remote device.

    Built by :class:`SSHLauncher`; :meth:`start` acquires the ssh session, the remote
    dir and process, the forward and the control connection, and on any failure
    unwinds what it got through :meth:`stop`, the one exit path.
    """

    def __init__(self, device: Device, spec: ParticipantSpec) -> None:
        self.instance = spec.instance
        self.device = device.name
        self.host_label = f"{device.name} ({device.target}:{device.port})"
        self.data_host = device.address
        self.data_bind = "0.0.0.0"  # the data path is authenticated; partners connect here
        self.conn: Any = None
        self.pid: int | None = None
        self.port: int | None = None
        self.local_port: int | None = None
        self.workdir: str | None = None
        self.env: dict[str, Any] = {}
        self.shipped: list[str] = []  # the wheels this deploy unpacked on the device
        self.timings: dict[str, float] = {}
        self._device = device
        self._spec = spec
        self._ctl_dir: str | None = None
        self._ctl_name = secrets.token_hex(6)
        self._proc: subprocess.Popen | None = None
        self._command = ""
        self._stopped = False
        self._t0 = 0.0
        self._timed_out = False
        self._why: TracrError | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=200)
        self._stdout_q: queue.Queue[Any] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._beats = 0  # heartbeats seen: the participant itself runs
        self._stop_lock = threading.Lock()

    # -- start ---------------------------------------------------------------------------
    def _pump(self, stream, sink, eof: bool) -> None:
        """Read one of ssh's streams for the session's whole life (never let it block)."""
        try:
            for raw in iter(stream.readline, b""):
                self.heard()
                line = raw.decode(errors="replace").rstrip("\n")
                if line == ALIVE_LINE:
                    self._beats += 1
                    continue
                sink(line)
        except (OSError, ValueError):
            pass
        finally:
            if eof:
                self._stdout_q.put(_EOF)

    def _launch(self, codec: str | None) -> None:
        """Start the one ssh session that ships, bootstraps and becomes the participant."""
        dev, spec = self._device, self._spec
        args = ["--role", spec.role, "--instance", spec.instance, "--host", "127.0.0.1",
                "--port", "0", "--idle-timeout", str(spec.liveness_s)]  # fmt: skip
        if spec.threads:
            args += ["--threads", str(int(spec.threads))]
        if plugin_modules():  # shipped in the bundle (app_api.plugins)
            args += ["--plugins", ",".join(plugin_modules())]
        need = ["torch"] + (["blosc2"] if codec not in (None, "none") else [])
        ship = [m for mods in wheels.distributions(wheels.groups_for(codec)).values()
                for m in mods]  # fmt: skip
        cmd = bootstrap_command(dev.python, {"need": need, "ship": ship, "args": args})
        self._command = (
            f"{dev.python} -c <bootstrap> < bundle; then in the temp dir: "
            f"venv/bin/python -m {PARTICIPANT_MODULE} {shlex.join(args)}"
        )
        blob = build_bundle()
        # A session of its own: a Ctrl-C at the terminal reaches the observer, which
        # tears down over this connection, instead of killing ssh under it.
        self._proc = ssh.spawn(
            ssh.ssh_argv(dev, cmd, control_path=self._control_path()), start_new_session=True
        )
        self.heard()
        for stream, sink, eof in ((self._proc.stdout, self._stdout_q.put, True),
                                  (self._proc.stderr, self._stderr.append, False)):  # fmt: skip
            t = threading.Thread(target=self._pump, args=(stream, sink, eof), daemon=True,
                                 name=f"ssh-{self.instance}")  # fmt: skip
            t.start()
            self._threads.append(t)
        # the wheels the device lacks and the secret follow once the bootstrap said what
        # it lacks (:meth:`_ship`)
        self._write(bundle_header(blob) + blob)

    def _write(self, data: bytes) -> bool:
        """Write to the session's stdin; False when ssh or the bootstrap ended early (its
        output says why)."""
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
            return True
        except OSError:
            return False

    def _preflight(self, codec: str | None) -> None:
        """Before anything is deployed: when the device's last check says what it lacks,
        the wheel cache must cover it (the message says how to fill it)."""
        check = self._device.last_check or {}
        if check.get("status") != "ok" or not isinstance(check.get("modules"), dict):
            return  # no torch there, or not recorded by its check: the bootstrap's report decides
        platform = wheels.DevicePlatform.from_facts(check["platform"])
        wheels.wheels_for(self._device.name, platform,
                          wheels.lacking(check["modules"], wheels.groups_for(codec)))

    def _ship(self, report: dict, codec: str | None) -> None:
        """Send the wheels of what the device lacks, then the secret (the participant's
        first line) and from then on the observer's heartbeat."""
        found = report.get("found") or {}
        platform = wheels.DevicePlatform.from_facts(report.get("platform") or {})
        dists = wheels.lacking(found, wheels.groups_for(codec))
        # without torch nothing runs: the bootstrap's report says so (_check_boot)
        paths = wheels.wheels_for(self._device.name, platform, dists) if found.get("torch") else []
        self.shipped = [p.name for p in paths]
        if paths:
            log.info("%s: shipping %d wheels to %s: %s", self.instance, len(paths),
                     self.device, ", ".join(self.shipped))
        payload = wheels_payload(paths)
        if self._write(payload + self._spec.secret.hex().encode() + b"\n"):
            self.open_beats(self._proc.stdin.fileno())

    def _next_line(self, t0: float) -> str | None:
        """The next stdout line, or None at EOF or when the start-up wait must end
        (``self._timed_out`` and ``self._why`` tell which): silent for the liveness
        timeout, the start-up cap reached, or stopped."""
        ctl = self._control_path()
        spec = self._spec
        while True:
            try:
                wait = 0.1 if "ssh_s" in self.timings else 0.05
                item = self._stdout_q.get(timeout=wait)
            except queue.Empty:
                if "ssh_s" not in self.timings and ctl and os.path.exists(ctl):
                    self.timings["ssh_s"] = time.perf_counter() - self._t0  # logged in (master up)
                silent = spec.liveness_s if self._beats else max(spec.liveness_s, BOOT_SILENCE_S)
                err = startup_error(self, spec, t0, silent_s=silent)
                if err is not None:
                    self._timed_out, self._why = True, err
                    return None
                continue
            if item is _EOF:
                self._timed_out = False
                return None
            return item

    def _fail(self, what: str) -> TracrError:
        """The error for the session's end (:func:`app_api.launch.ssh_errors.deploy_error`),
        once ssh has exited (or, given up on, as it is) and its last words are read."""
        proc = self._proc
        try:
            rc = proc.wait(timeout=5) if not self._timed_out else proc.poll()
        except subprocess.TimeoutExpired:
            rc = None
        for t in self._threads:
            t.join(timeout=1)
        return deploy_error(self.instance, self._spec.role, self._device, self._command, rc,
                            self.stderr_tail(40), self.workdir is not None, what)

    def _await_ready(self, codec: str | None) -> None:
        t0 = time.monotonic()
        self._timed_out = False
        while True:  # the bootstrap's report, then the participant's
            line = self._next_line(t0)
            if line is None:
                if self._timed_out:
                    why = self._why
                    fail = self._fail("did not report ready")
                    why.message = f"{why.message}\n{fail.message.split(chr(10), 1)[-1]}"
                    raise why
                raise self._fail("exited")
            if line.startswith(NEED_PREFIX) and not self.env:
                self._ship(json.loads(line[len(NEED_PREFIX):]), codec)
            elif line.startswith(BOOT_PREFIX) and not self.env:
                self.env = json.loads(line[len(BOOT_PREFIX) :])
                self.workdir = self.env["dir"]
                self.timings["boot_s"] = time.perf_counter() - self._t0
                if (err := boot_error(self.instance, self._device, self.env, codec)) is not None:
                    raise err
            elif (ready := Ready.parse(line)) is not None:
                self.port, self.pid = ready.port, ready.pid
                self.timings["ready_s"] = time.perf_counter() - self._t0
                break
            else:
                log.debug("%s stdout: %s", self.instance, line)
        threading.Thread(target=self._drain_stdout, daemon=True).start()

    def _drain_stdout(self) -> None:
        while (line := self._stdout_q.get()) is not _EOF:
            log.debug("%s stdout: %s", self.instance, line)

    def _forward(self) -> int:
        """A local port forwarded to the participant's rpyc port, through the mux master."""
        dev = self._device
        base = ["ssh", *ssh.ssh_options(dev, control_path=self._control_path())]
        for _ in range(5):  # the free port can be taken between our probe and ssh's bind
            lport = free_local_port()
            argv = [*base, "-O", "forward", "-L", f"127.0.0.1:{lport}:127.0.0.1:{self.port}",
                    dev.target]  # fmt: skip
            cp = subprocess.run(argv, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
            if cp.returncode == 0:
                return lport
            err = cp.stderr.decode(errors="replace")
            if "forwarding failed" not in err.lower() and "in use" not in err.lower():
                break
        raise TracrError(
            f"{self.instance}: cannot forward a local port to the participant on {dev.name}\n"
            + ssh.failure_block(shlex.join(argv), dev.host, cp.returncode, "", err)
        )

    def start(self, codec: str | None = None,
              adopt: Callable[[ParticipantHandle], None] | None = None) -> SSHParticipant:
        """Deploy and start; on any failure everything started so far is torn down.

        ``adopt`` gets this handle once its ssh session exists (see :meth:`Launcher.start`).
        """
        self._t0 = time.perf_counter()
        try:
            self._preflight(codec)
            self._ctl_dir = control_dir()
            self._launch(codec)
            if adopt is not None:
                adopt(self)
            self._await_ready(codec)
            t3 = time.perf_counter()
            self.local_port = self._forward()
            self.conn = connect_control("127.0.0.1", self.local_port, self._spec.secret)
            t4 = time.perf_counter()
        except BaseException:
            self.stop(timeout=5)
            raise
        ready = self.timings.pop("ready_s")
        boot = self.timings.pop("boot_s", ready)
        ssh_s = self.timings.pop("ssh_s", None)
        self.timings = {
            "ssh_s": ssh_s if ssh_s is not None else boot,
            "ship_s": boot - (ssh_s or boot),  # unpack + venv on the device
            "participant_s": ready - boot,  # mostly `import torch`
            "connect_s": t4 - t3,  # port forward + authenticated rpyc
        }
        log.debug("%s on %s: %s", self.instance, self.device, self.timings)
        return self

    # -- ParticipantHandle -----------------------------------------------------------------
    def alive(self) -> bool:
        """True while the remote participant (and its ssh session) runs."""
        return self._proc is not None and self._proc.poll() is None and not self._stopped

    def ended(self) -> str:
        """``died (pid N)``, or, when ssh itself gave up on the device (its keep-alives
        unanswered, the connection reset), that the device was cut off: the participant
        may well still run there, and exits by itself after its idle timeout."""
        if self._proc is not None and self._proc.poll() is not None:
            for t in self._threads:  # ssh has exited: its last words are on their way
                t.join(timeout=1.0)
        rc = self._proc.returncode if self._proc is not None else None
        return cut_off(self._stderr, rc, self.silent_for()) or super().ended()

    def stderr_tail(self, n: int = 20) -> str:
        """Last ``n`` lines the participant (or ssh) wrote to stderr."""
        return "\n".join(list(self._stderr)[-n:])

    def _control_path(self) -> str | None:
        return f"{self._ctl_dir}/{self._ctl_name}" if self._ctl_dir else None

    def _remote(self, command: str, timeout: float = 15.0) -> None:
        try:
            ssh.run_ssh(self._device, command, timeout=timeout, check=False,
                        control_path=self._control_path())  # fmt: skip
        except TracrError as exc:
            log.warning("cleanup on %s: %s", self.device, exc.message)

    def stop(self, timeout: float = 10.0) -> None:
        """Unwind what the launch made, last acquired first; idempotent.

        The control connection (asking the participant to shut down), the ssh session
        (closing stdin ends the master and its forward, and the participant with it),
        whatever the remote end still holds, the ssh process, its control socket.
        """
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        # a participant that is not heartbeating (stopped, wedged) answers nothing: no waits
        responsive = self.beating()
        self._close_control(timeout if responsive else 0)
        self._end_session(timeout if responsive else 0)
        self._clean_remote(timeout)
        self._reap_ssh()
        self._remove_control_socket()

    def _close_control(self, timeout: float) -> None:
        if self.conn is None:
            return
        if timeout > 0:
            try:
                from rpyc.core import consts, netref

                reply = netref.asyncreq(self.conn.root, consts.HANDLE_CALLATTR, "shutdown",
                                        (), ())  # fmt: skip
                reply.set_expiry(min(2.0, timeout))
                reply.wait()
            except Exception:  # best effort: the process may be gone or hung already
                pass
        drop_connection(self.conn)

    def _end_session(self, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        self.close_beats()
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=max(1.0, timeout / 2) if timeout > 0 else 0.2)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        """Kill the ssh session now (the remote end loses its stdin); wait for nothing."""
        super().kill()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.kill()

    def _clean_remote(self, timeout: float) -> None:
        """Kill a participant the session's end did not stop; remove a dir nobody else will."""
        proc = self._proc
        cleanup = []
        running = proc is None or proc.poll() is None
        if self.pid and running:
            cleanup.append(
                f"kill -TERM {self.pid} 2>/dev/null; sleep 0.5; kill -KILL {self.pid} 2>/dev/null"
            )
        elif self.env.get("pid") and running:  # still importing torch: the wrapper's child
            w = int(self.env["pid"])
            cleanup.append(f"pkill -TERM -P {w}; sleep 0.5; pkill -KILL -P {w}")
        # The sh wrapper removes the dir when python ends, however it ends; only a wrapper
        # that never started, or an ssh that died (255), leaves the job to us.
        wrapper_done = proc is not None and proc.poll() is not None and proc.returncode != 255
        if self.workdir and not wrapper_done:
            cleanup.append(f"rm -rf {shlex.quote(self.workdir)}")
        if cleanup:
            self._remote("; ".join(cleanup) + "; true", timeout=max(5.0, timeout))

    def _reap_ssh(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for stream in (proc.stdout, proc.stderr):
            try:
                stream.close()
            except Exception:
                pass

    def _remove_control_socket(self) -> None:
        if self._ctl_dir:  # the master removes its socket on exit; make sure
            with contextlib.suppress(OSError):
                os.unlink(self._control_path())

    def leftovers(self) -> list[str]:
        """Remote processes and the temp dir still present (empty when clean)."""
        if not self.workdir and not self.pid:
            return []
        return remote_leftovers(self._device, self.workdir, self.pid)


class SSHLauncher(Launcher):
    """Starts participants on one paired device over SSH.

    >>> launcher = SSHLauncher("jetson")
    >>> with launcher.start(ParticipantSpec("edge-1", "edge", "jetson", 1, secret)) as handle:
    ...     handle.conn.root.hello()
    """

    def __init__(self, device: Device | str, *, codec: str | None = None) -> None:
        self.device = get_device(device) if isinstance(device, str) else device
        if self.device.builtin:
            raise TracrError("'localhost' runs without SSH; use the local launcher.")
        self.codec = codec

    def start(self, spec: ParticipantSpec,
              adopt: Callable[[ParticipantHandle], None] | None = None) -> SSHParticipant:
        """Deploy and start one participant; returns once its control connection is up."""
        return SSHParticipant(self.device, spec).start(codec=self.codec, adopt=adopt)
