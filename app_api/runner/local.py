"""The built-in ``localhost`` device: each participant is its own local process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from app_api.runner.launcher import Launcher, ParticipantHandle, ParticipantSpec
from experiment_design.errors import TracrError

REPO_ROOT = Path(__file__).resolve().parents[2]
READY = "TRACR-READY "


class LocalHandle(ParticipantHandle):
    """A participant process on this machine, reached over loopback."""

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
        self._stopped = False

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

    def stop(self, timeout: float = 10.0) -> None:
        """Ask politely (close control + stdin), then terminate, then kill."""
        if self._stopped:
            return
        self._stopped = True
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # already gone
                pass
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=max(0.5, timeout / 2))
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=max(0.5, timeout / 2))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
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
    """Starts ``python -m experiment_design.participant`` as a child process."""

    def __init__(self, python: str | None = None, ready_timeout: float = 60.0) -> None:
        self.python = python or sys.executable
        self.ready_timeout = ready_timeout

    def start(self, spec: ParticipantSpec) -> ParticipantHandle:
        """Start the process, wait for TRACR-READY, open the authenticated control connection."""
        from experiment_design.runtime import connect_control

        workdir = tempfile.mkdtemp(prefix=f"tracr-{spec.instance}-")
        stderr_path = os.path.join(workdir, "stderr.log")
        cmd = [self.python, "-m", "experiment_design.participant", "--role", spec.role,
               "--instance", spec.instance, "--host", "127.0.0.1", "--port", "0",
               "--workdir", workdir, "--cleanup-workdir",
               "--threads", str(spec.threads or 1)]
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
        finally:
            errf.close()
        handle = LocalHandle(spec, proc, workdir, stderr_path)
        try:
            proc.stdin.write((spec.secret.hex() + "\n").encode())
            proc.stdin.flush()
            port = self._wait_ready(handle)
            handle.conn = connect_control("127.0.0.1", port, spec.secret)
        except BaseException:
            tail = handle.stderr_tail()
            handle.stop(timeout=2)
            if isinstance(tail, str) and tail:
                raise TracrError(
                    f"participant {spec.instance} (role {spec.role}) on localhost failed to start",
                    hint=f"its stderr:\n{tail}",
                ) from None
            raise
        return handle

    def _wait_ready(self, handle: LocalHandle) -> int:
        result: dict = {}

        def reader() -> None:
            for raw in handle.proc.stdout:
                line = raw.decode(errors="replace").strip()
                if line.startswith(READY):
                    result.update(json.loads(line[len(READY):]))
                    return

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline and t.is_alive():
            t.join(0.05)
            if handle.proc.poll() is not None and t.is_alive():
                t.join(0.5)
                break
        if "port" not in result:
            raise TracrError(
                f"participant {handle.instance} did not become ready",
                hint=f"exit code {handle.proc.poll()}; stderr:\n{handle.stderr_tail()}",
            )
        return int(result["port"])
