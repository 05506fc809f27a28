"""Zero-deploy over SSH: a participant in a temporary venv on a paired device.

One SSH invocation per participant does the whole deploy: it connects (host
key checked against tracr's known_hosts), becomes the ControlMaster for this
participant, and runs the bootstrap, which reads the bundle from stdin into a
fresh ``/tmp/tracr-XXXXXXXX``, makes a venv that reuses the device's torch,
and execs the participant bound to the device's loopback inside a ``sh``
wrapper that removes the dir however python ends. The observer then reads
``TRACR-READY`` and adds a local port forward to the participant's rpyc port
through the same master (``ssh -O forward``: no new login). The session's
stdin stays open: if the observer dies, ssh dies, stdin hits EOF and the
participant exits by itself.
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
import socket
import subprocess
import tempfile
import threading
import time
from typing import Any

from app_api.devices import ssh
from app_api.devices.bundle import bootstrap_command, build_bundle, bundle_header
from app_api.devices.registry import Device, get_device
from app_api.runner.launcher import Launcher, ParticipantHandle, ParticipantSpec
from experiment_design.errors import TracrError

log = logging.getLogger(__name__)

READY_PREFIX = "TRACR-READY "
BOOT_PREFIX = "TRACR-BOOT "
READY_TIMEOUT_S = 120.0  # a Raspberry Pi can take a while to import torch
_EOF = object()


def _control_dir() -> str:
    """A private directory for ssh control sockets (one per user, reused; sockets vanish)."""
    path = os.path.join(tempfile.gettempdir(), f"tracr-ssh-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if st.st_uid != os.getuid() or not os.path.isdir(path) or os.path.islink(path):
        raise TracrError(f"{path} is not a private directory of this user.", hint=f"Remove {path}.")
    os.chmod(path, 0o700)
    return path


def _free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SSHParticipantHandle(ParticipantHandle):
    """A participant running in a temporary venv on a remote device."""

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
        self._stderr: collections.deque[str] = collections.deque(maxlen=200)
        self._stdout_q: queue.Queue[Any] = queue.Queue()
        self._threads: list[threading.Thread] = []

    # -- start ---------------------------------------------------------------------------
    def _pump(self, stream, sink, eof: bool) -> None:
        try:
            for raw in iter(stream.readline, b""):
                sink(raw.decode(errors="replace").rstrip("\n"))
        except (OSError, ValueError):
            pass
        finally:
            if eof:
                self._stdout_q.put(_EOF)

    def _launch(self, codec: str | None) -> None:
        """Start the one ssh session that ships, bootstraps and becomes the participant."""
        dev, spec = self._device, self._spec
        args = ["--role", spec.role, "--instance", spec.instance, "--host", "127.0.0.1",
                "--port", "0"]  # fmt: skip
        if spec.threads:
            args += ["--threads", str(int(spec.threads))]
        need = ["torch"] + (["blosc2"] if codec not in (None, "none") else [])
        cmd = bootstrap_command(dev.python, {"need": need, "args": args})
        self._command = (
            f"{dev.python} -c <bootstrap> < bundle; then in the temp dir: "
            f"venv/bin/python -m experiment_design.participant {shlex.join(args)}"
        )
        bundle = build_bundle()
        # A session of its own: a Ctrl-C at the terminal reaches the observer, which
        # tears down over this connection, instead of killing ssh under it.
        self._proc = ssh.spawn(
            ssh.ssh_argv(dev, cmd, control_path=self._control_path()), start_new_session=True
        )
        for stream, sink, eof in ((self._proc.stdout, self._stdout_q.put, True),
                                  (self._proc.stderr, self._stderr.append, False)):  # fmt: skip
            t = threading.Thread(target=self._pump, args=(stream, sink, eof), daemon=True,
                                 name=f"ssh-{self.instance}")  # fmt: skip
            t.start()
            self._threads.append(t)
        try:  # the secret follows the bundle; the participant reads it as its first line
            self._proc.stdin.write(
                bundle_header(bundle) + bundle + spec.secret.hex().encode() + b"\n"
            )
            self._proc.stdin.flush()
        except OSError:  # ssh or the bootstrap ended early: its output says why
            pass

    def _next_line(self, deadline: float) -> str | None:
        """The next stdout line, or None at EOF/timeout (``self._timed_out`` tells which)."""
        ctl = self._control_path()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._timed_out = True
                return None
            try:
                wait = left if "ssh_s" in self.timings else min(left, 0.05)
                item = self._stdout_q.get(timeout=wait)
            except queue.Empty:
                if "ssh_s" not in self.timings and ctl and os.path.exists(ctl):
                    self.timings["ssh_s"] = time.perf_counter() - self._t0  # logged in (master up)
                continue
            if item is _EOF:
                self._timed_out = False
                return None
            return item

    def _fail(self, what: str) -> TracrError:
        dev = self._device
        proc = self._proc
        try:
            rc = proc.wait(timeout=5) if not self._timed_out else proc.poll()
        except subprocess.TimeoutExpired:
            rc = None
        for t in self._threads:
            t.join(timeout=1)
        err = self.stderr_tail(40)
        block = ssh.failure_block(self._command, dev.host, rc, "", err)
        if rc == 255:
            status = ssh.classify_ssh_failure(err)
            if status:
                return ssh.ssh_error(dev, status, block)
        if self.workdir is None and (rc == 127 or "not found" in err or "No such file" in err):
            return TracrError(
                f"{self.instance}: python '{dev.python}' not found on {dev.name}\n{block}",
                hint=f"Re-pair with the right interpreter: tracr device pair --name {dev.name} --python PATH",
            )
        if self.workdir is None:
            return TracrError(f"{self.instance}: deploying to {dev.name} failed\n{block}")
        return TracrError(
            f"participant {self.instance} ({self._spec.role}) on {dev.name} {what}\n{block}"
        )

    def _check_boot(self, codec: str | None) -> None:
        dev = self._device
        missing = self.env.get("missing") or []
        if "torch" in missing:
            raise TracrError(
                f"{self.instance}: device {dev.name} has no torch for {dev.python} "
                f"(python {self.env.get('version')}).",
                hint=f"Install it on the device ({dev.python} -m pip install torch torchvision), "
                f"or re-pair with an interpreter that has it: tracr device pair --name {dev.name} --python PATH",
            )
        if "blosc2" in missing:
            raise TracrError(
                f"{self.instance}: device {dev.name} lacks blosc2, needed by codec '{codec}'.",
                hint=f"On the device: {dev.python} -m pip install blosc2   (or run with --set transport.codec=none)",
            )

    def _await_ready(self, codec: str | None) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        self._timed_out = False
        while True:  # the bootstrap's report, then the participant's
            line = self._next_line(deadline)
            if line is None:
                raise self._fail(
                    f"did not report ready within {READY_TIMEOUT_S:.0f} s"
                    if self._timed_out else "exited"
                )  # fmt: skip
            if line.startswith(BOOT_PREFIX) and not self.env:
                self.env = json.loads(line[len(BOOT_PREFIX) :])
                self.workdir = self.env["dir"]
                self.timings["boot_s"] = time.perf_counter() - self._t0
                self._check_boot(codec)
            elif line.startswith(READY_PREFIX):
                ready = json.loads(line[len(READY_PREFIX) :])
                self.port, self.pid = int(ready["port"]), int(ready["pid"])
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
            lport = _free_local_port()
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

    def start(self, codec: str | None = None) -> SSHParticipantHandle:
        """Deploy and start; on any failure everything started so far is torn down."""
        from experiment_design.runtime import connect_control

        self._t0 = time.perf_counter()
        try:
            self._ctl_dir = _control_dir()
            self._launch(codec)
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
        """Shut down, close stdin (ends the ssh master and its forward), kill if needed, clean up."""
        if self._stopped:
            return
        self._stopped = True
        if self.conn is not None:
            try:
                import rpyc

                reply = rpyc.async_(self.conn.root.shutdown)()
                reply.set_expiry(min(3.0, timeout))
                reply.wait()
            except Exception:  # best effort: the process may be gone or hung already
                pass
            try:
                self.conn.close()
            except Exception:
                pass
        proc = self._proc
        if proc is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=max(1.0, timeout / 2))
            except subprocess.TimeoutExpired:
                pass
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
        if proc is not None:
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
        if self._ctl_dir:  # the master removes its socket on exit; make sure
            with contextlib.suppress(OSError):
                os.unlink(self._control_path())

    def leftovers(self) -> list[str]:
        """Remote processes and the temp dir still present (empty when clean)."""
        if not self.workdir and not self.pid:
            return []
        return remote_leftovers(self._device, self.workdir, self.pid)


def remote_leftovers(device: Device, workdir: str | None, pid: int | None) -> list[str]:
    """Processes whose PID is ``pid`` or whose command line names ``workdir``, and the dir itself."""
    # The script goes on stdin so no command line (not even ssh's, on loopback) names workdir.
    script = "echo SELF $$; ps -eo pid=,ppid=,args=\n"
    if workdir:
        script += f"if [ -e {shlex.quote(workdir)} ]; then echo DIR-PRESENT; fi\n"
    cp = ssh.run_ssh(device, "sh -s", input=script.encode(), timeout=30)
    lines = cp.stdout.decode(errors="replace").splitlines()
    me = next((ln.split()[1] for ln in lines if ln.startswith("SELF ")), "")
    found = []
    for ln in lines:
        if ln.startswith(("SELF ", "DIR-PRESENT")):
            continue
        parts = ln.split(None, 2)
        if len(parts) < 3 or me in parts[:2]:
            continue
        if (pid and parts[0] == str(pid)) or (workdir and workdir in parts[2]):
            found.append(f"process {parts[0]}: {parts[2]}")
    if "DIR-PRESENT" in lines:
        found.append(f"directory {workdir}")
    return found


class SSHLauncher(Launcher):
    """Starts participants on one paired device over SSH.

    >>> launcher = SSHLauncher("jetson")
    >>> handle = launcher.start(ParticipantSpec("edge-1", "edge", "jetson", 1, secret))
    >>> handle.conn.root.hello(); handle.stop()
    """

    def __init__(self, device: Device | str, *, codec: str | None = None) -> None:
        self.device = get_device(device) if isinstance(device, str) else device
        if self.device.builtin:
            raise TracrError("'localhost' runs without SSH; use the local launcher.")
        self.codec = codec

    def start(self, spec: ParticipantSpec) -> SSHParticipantHandle:
        """Deploy and start one participant; returns once its control connection is up."""
        return SSHParticipantHandle(self.device, spec).start(codec=self.codec)


def launcher_for_device(device: Device | str) -> Launcher:
    """The launcher for a device: local for ``localhost``, SSH for paired devices."""
    name = device if isinstance(device, str) else device.name
    if name == "localhost":
        from app_api.runner.local import LocalLauncher

        return LocalLauncher()
    return SSHLauncher(device)
