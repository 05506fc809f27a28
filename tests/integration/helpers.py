"""Small helpers shared by the integration tests."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def wait_rows(csv: Path, proc: subprocess.Popen, n: int = 2, timeout: float = 150) -> None:
    """Wait until the run writing ``csv`` has more than ``n`` inference rows (header excluded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if csv.exists() and len(csv.read_text().splitlines()) > n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.communicate()}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("no inference rows appeared")


def live_processes(root, marker: str) -> list:
    """``root``'s descendants (psutil processes) whose command line holds ``marker``, zombies
    left out: an exited child that is not reaped yet is not running, and psutil refuses
    its command line (ZombieProcess), which ended a test's search thread before."""
    import psutil

    out = []
    for p in root.children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and marker in " ".join(p.cmdline()):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return out
