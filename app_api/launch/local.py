"""The built-in ``localhost`` device: each participant is its own local process.

The sibling of :mod:`app_api.launch.ssh` over :mod:`app_api.launch.base`: no SSH,
no bundle; the child runs the participant module from this checkout in a temp
directory that goes away with it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from app_api.launch.base import (
    Launcher,
    ParticipantHandle,
    ParticipantSpec,
    drop_connection,
    startup_error,
)
from experiment_design.errors import TracrError
from experiment_design.protocol import ALIVE_LINE, PARTICIPANT_MODULE, Ready
from experiment_design.runtime import connect_control

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]


class LocalParticipant(ParticipantHandle):
    """A participant process on this machine, reached over loopback.

    Owns the child process (its pipes and process group) and its work dir. One thread
    reads the child's stdout for its whole life (a child whose output nobody reads
    blocks once the pipe's 64 KiB are full): the READY line, heartbeats, anything
    else the role prints. :meth:`stop` unwinds: control connection, stdin (the polite
    goodbye), the process group (SIGKILL after a short grace), its pipes, the dir.
    """

    def __init__(self, spec: ParticipantSpec, proc: subprocess.Popen, workdir: str,
                 stderr_path: str) -> None:
        self.instance = spec.instance
        self.device = spec.device
        self.host_label = "localhost"
        self.data_host = "127.0.0.1"
        self.proc = proc
        self.pid = proc.pid
        self.workdir = workdir
        self.stderr_path = stderr_path
        self.conn = None
        self.port: int | None = None
        self.ready = threading.Event()
        self.stdout_lines = 0  # lines other than the protocol's, read and logged
        self._stdout: collections.deque[str] = collections.deque(maxlen=50)
        self._stopped = False
        self._stop_lock = threading.Lock()
        self.heard()
        self._reader = threading.Thread(target=self._read_stdout, daemon=True,
                                        name=f"stdout-{spec.instance}")
        self._reader.start()

    def _read_stdout(self) -> None:
        try:
            for raw in self.proc.stdout:
                self.heard()
                line = raw.decode(errors="replace").rstrip("\n")
                if line == ALIVE_LINE:
                    continue
                if not self.ready.is_set():
                    ready = Ready.parse(line)
                    if ready is not None:
                        self.port = ready.port
                        self.ready.set()
                        continue
                self.stdout_lines += 1
                self._stdout.append(line)
                log.debug("%s stdout: %s", self.instance, line)
        except (OSError, ValueError):  # the pipe was closed under us by stop()
            pass

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc.poll() is None

    def stderr_tail(self, n: int = 20) -> str:
        """Last lines of the participant's stderr."""
        try:
            lines = Path(self.stderr_path).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def kill(self) -> None:
        """SIGKILL the participant's process group now; wait for nothing."""
        super().kill()
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def stop(self, timeout: float = 10.0) -> None:
        """Unwind in order, idempotently: the control connection, stdin (the polite
        goodbye), the process group (SIGKILL when it has not ended within the grace;
        at once when it is not heartbeating: a stopped process never ends by itself),
        its pipe, the work dir."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        grace = max(0.2, timeout / 2) if self.beating() else 0.2
        self.close_beats()
        drop_connection(self.conn)
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        # the group too: whatever the participant started (compile workers) goes with it
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self._reader.join(timeout=1)
        for stream in (self.proc.stdout,):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass
        shutil.rmtree(self.workdir, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """The process if still running and the work dir if still present."""
        out = []
        if self.proc.poll() is None:
            out.append(f"process {self.pid}")
        if os.path.exists(self.workdir):
            out.append(f"dir {self.workdir}")
        return out


class LocalLauncher(Launcher):
    """Starts ``python -m <PARTICIPANT_MODULE>`` as a child process of the observer."""

    def __init__(self, python: str | None = None) -> None:
        self.python = python or sys.executable

    def start(self, spec: ParticipantSpec,
              adopt: Callable[[ParticipantHandle], None] | None = None) -> LocalParticipant:
        """Start the process, wait for TRACR-READY, open the authenticated control connection."""
        workdir = tempfile.mkdtemp(prefix=f"tracr-{spec.instance}-")
        stderr_path = os.path.join(workdir, "stderr.log")
        cmd = [self.python, "-m", PARTICIPANT_MODULE, "--role", spec.role,
               "--instance", spec.instance, "--host", "127.0.0.1", "--port", "0",
               "--workdir", workdir, "--cleanup-workdir",
               "--threads", str(spec.threads or 1), "--idle-timeout", str(spec.liveness_s)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env.setdefault("OMP_NUM_THREADS", str(spec.threads or 1))
        # torch may create compiler caches; keep them in the workdir so they go with it
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(workdir, "cache", "inductor")
        env["TRITON_CACHE_DIR"] = os.path.join(workdir, "cache", "triton")
        errf = open(stderr_path, "wb")  # noqa: SIM115 - owned by the child
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errf, env=env,
                cwd=workdir, start_new_session=True,  # Ctrl-C goes to the observer, which tears down
            )
        except BaseException:  # no process, so no handle yet to own the dir
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        finally:
            errf.close()
        handle = LocalParticipant(spec, proc, workdir, stderr_path)
        try:
            proc.stdin.write((spec.secret.hex() + "\n").encode())
            proc.stdin.flush()
            handle.open_beats(proc.stdin.fileno())
            if adopt is not None:
                adopt(handle)
            port = self._wait_ready(handle, spec)
            handle.conn = connect_control("127.0.0.1", port, spec.secret)
        except BaseException as exc:
            tail = handle.stderr_tail()
            handle.stop(timeout=2)
            if isinstance(exc, TracrError):
                if tail and not exc.hint:
                    exc.hint = f"its stderr:\n{tail}"
                raise
            if isinstance(tail, str) and tail:
                raise TracrError(
                    f"participant {spec.instance} (role {spec.role}) on localhost failed to start",
                    hint=f"its stderr:\n{tail}",
                ) from None
            raise
        return handle

    def _wait_ready(self, handle: LocalParticipant, spec: ParticipantSpec) -> int:
        """The READY port, waiting while heartbeats arrive (up to ``spec.startup_s``)."""
        t0 = time.monotonic()
        while not handle.ready.wait(0.1):
            if handle.proc.poll() is not None:
                handle.ready.wait(0.5)  # the line may still be in the pipe
                if handle.ready.is_set():
                    break
                raise TracrError(
                    f"participant {handle.instance} did not become ready",
                    hint=f"exit code {handle.proc.poll()}; stderr:\n{handle.stderr_tail()}",
                )
            err = startup_error(handle, spec, t0)
            if err is not None:
                raise err
        return int(handle.port)
