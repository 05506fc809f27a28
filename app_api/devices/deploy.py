"""Zero-deploy over SSH: a participant in a temporary venv on a paired device.

For each participant: open SSH (plumbum ``SshMachine``, host key checked
against tracr's known_hosts), ship the bundle as one tar stream into a fresh
``/tmp/tracr-XXXXXXXX`` with a venv that reuses the device's torch, start the
participant bound to the device's loopback with its stdin held open by the
observer, read ``TRACR-READY``, and reach its rpyc service through an SSH
tunnel. The remote command is wrapped so the temp dir goes away even if python
is killed; if the observer dies, ssh dies, stdin hits EOF and the participant
exits by itself.
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
import tempfile
import threading
import time
from typing import Any

from app_api.devices import ssh
from app_api.devices.bundle import bootstrap_command, build_bundle
from app_api.devices.registry import Device, get_device
from app_api.runner.launcher import Launcher, ParticipantHandle, ParticipantSpec
from experiment_design.errors import TracrError

log = logging.getLogger(__name__)

READY_PREFIX = "TRACR-READY "
READY_TIMEOUT_S = 120.0  # a Raspberry Pi can take a while to import torch


def _control_dir() -> str:
    """A private directory for ssh control sockets (one per user, reused; sockets vanish)."""
    path = os.path.join(tempfile.gettempdir(), f"tracr-ssh-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if st.st_uid != os.getuid() or not os.path.isdir(path) or os.path.islink(path):
        raise TracrError(f"{path} is not a private directory of this user.", hint=f"Remove {path}.")
    os.chmod(path, 0o700)
    return path


def _open_machine(device: Device, control_path: str | None = None):
    from plumbum.machines.ssh_machine import SshMachine

    opts = ssh.ssh_options(device, control_path=control_path)
    # SshMachine adds -p/-i itself; keep ours in ssh_opts so the exact same options apply.
    try:
        return SshMachine(device.host, user=device.user, ssh_opts=opts, connect_timeout=20)
    except Exception as exc:  # plumbum raises SSHCommsError/ProcessExecutionError/EOFError
        # Re-run once with plain ssh to get a classified, readable failure.
        ssh.run_ssh(device, "true", timeout=30)  # raises the classified error
        raise TracrError(f"cannot open SSH to {device.name}: {exc}") from exc


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
        self.workdir: str | None = None
        self.env: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        self._device = device
        self._spec = spec
        self._machine = None
        self._ctl_dir: str | None = None
        self._ctl_name = secrets.token_hex(6)
        self._proc: subprocess.Popen | None = None
        self._tunnel = None
        self._stopped = False
        self._stderr: collections.deque[str] = collections.deque(maxlen=200)
        self._stdout_q: queue.Queue[str | None] = queue.Queue()
        self._threads: list[threading.Thread] = []

    # -- start ---------------------------------------------------------------------------
    def _bootstrap(self, codec: str | None) -> None:
        dev = self._device
        cmd = bootstrap_command(dev.python)
        bundle = build_bundle()
        proc = self._machine.popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = proc.communicate(input=bundle, timeout=120)
        out_s, err_s = out.decode(errors="replace"), err.decode(errors="replace")
        line = next((ln for ln in out_s.splitlines() if ln.startswith("TRACR-BOOT ")), None)
        if proc.returncode != 0 or line is None:
            block = ssh.failure_block(
                f"{dev.python} -c <bootstrap> < bundle", dev.host, proc.returncode, out_s, err_s
            )
            if proc.returncode == 127 or "not found" in err_s:
                raise TracrError(
                    f"{self.instance}: python '{dev.python}' not found on {dev.name}\n{block}",
                    hint=f"Re-pair with the right interpreter: tracr device pair --name {dev.name} --python PATH",
                )
            raise TracrError(f"{self.instance}: deploying to {dev.name} failed\n{block}")
        self.env = json.loads(line[len("TRACR-BOOT ") :])
        self.workdir = self.env["dir"]
        found = self.env.get("found", {})
        if not found.get("torch"):
            raise TracrError(
                f"{self.instance}: device {dev.name} has no torch for {dev.python} "
                f"(python {self.env.get('version')}).",
                hint=f"Install it on the device ({dev.python} -m pip install torch torchvision), "
                f"or re-pair with an interpreter that has it: tracr device pair --name {dev.name} --python PATH",
            )
        if codec not in (None, "none") and not found.get("blosc2"):
            raise TracrError(
                f"{self.instance}: device {dev.name} lacks blosc2, needed by codec '{codec}'.",
                hint=f"On the device: {dev.python} -m pip install blosc2   (or run with --set transport.codec=none)",
            )

    def _pump(self, stream, sink) -> None:
        try:
            for raw in iter(stream.readline, b""):
                sink(raw.decode(errors="replace").rstrip("\n"))
        except (OSError, ValueError):
            pass
        finally:
            if sink == self._stdout_q.put:
                self._stdout_q.put(None)

    def _start_participant(self) -> None:
        dev, spec = self._device, self._spec
        d = shlex.quote(self.workdir)
        py = shlex.quote(self.env["python"])
        args = [
            "-m", "experiment_design.runtime.participant", "--role", spec.role,
            "--instance", spec.instance, "--host", "127.0.0.1",
            "--port", "0", "--workdir", self.workdir, "--cleanup-workdir",
        ]  # fmt: skip
        if spec.threads:
            args += ["--threads", str(int(spec.threads))]
        inner = (
            f"cd {d} && PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 {py} "
            f"{' '.join(shlex.quote(a) for a in args)}; rm -rf {d}"
        )
        self._command = inner
        self._proc = self._machine.popen(
            f"sh -c {shlex.quote(inner)}",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for stream, sink in (
            (self._proc.stdout, self._stdout_q.put),
            (self._proc.stderr, self._stderr.append),
        ):
            t = threading.Thread(
                target=self._pump, args=(stream, sink), daemon=True, name=f"ssh-{self.instance}"
            )
            t.start()
            self._threads.append(t)
        self._proc.stdin.write(spec.secret.hex().encode() + b"\n")
        self._proc.stdin.flush()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                line = self._stdout_q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = "<timeout>"
            if line is None or line == "<timeout>":
                time.sleep(0.2)  # let stderr drain
                what = (
                    "exited"
                    if line is None
                    else f"did not report ready within {READY_TIMEOUT_S:.0f} s"
                )
                block = ssh.failure_block(
                    inner, dev.host, self._proc.poll(), "", self.stderr_tail(40)
                )
                raise TracrError(
                    f"participant {self.instance} ({spec.role}) on {dev.name} {what}\n{block}"
                )
            if line.startswith(READY_PREFIX):
                ready = json.loads(line[len(READY_PREFIX) :])
                self.port, self.pid = int(ready["port"]), int(ready["pid"])
                break
            log.debug("%s stdout: %s", self.instance, line)
        threading.Thread(target=self._drain_stdout, daemon=True).start()

    def _drain_stdout(self) -> None:
        while (line := self._stdout_q.get()) is not None:
            log.debug("%s stdout: %s", self.instance, line)

    def start(self, codec: str | None = None) -> SSHParticipantHandle:
        """Deploy and start; on any failure everything started so far is torn down."""
        from experiment_design.runtime import connect_control

        t0 = time.perf_counter()
        try:
            self._ctl_dir = _control_dir()
            self._machine = _open_machine(self._device, self._control_path())
            t1 = time.perf_counter()
            self._bootstrap(codec)
            t2 = time.perf_counter()
            self._start_participant()
            t3 = time.perf_counter()
            self._tunnel = self._machine.tunnel(0, self.port, lhost="127.0.0.1", dhost="127.0.0.1")
            self.conn = connect_control("127.0.0.1", int(self._tunnel.lport), self._spec.secret)
            t4 = time.perf_counter()
        except BaseException:
            self.stop(timeout=5)
            raise
        self.timings = {
            "ssh_s": t1 - t0,
            "ship_s": t2 - t1,
            "participant_s": t3 - t2,
            "connect_s": t4 - t3,
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
        """Shut down, close stdin, wait, kill if needed, remove the temp dir, close tunnel and SSH."""
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
        if self.pid and (proc is None or proc.poll() is None):
            cleanup.append(
                f"kill -TERM {self.pid} 2>/dev/null; sleep 0.5; kill -KILL {self.pid} 2>/dev/null"
            )
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
        for closer in (self._tunnel, self._machine):  # the machine's ssh is the mux master: last
            if closer is not None:
                try:
                    closer.close()
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
