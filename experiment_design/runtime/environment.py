"""What a participant reports about itself in ``hello()``."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

import experiment_design
from experiment_design.runtime import allocator


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    if os.environ.get("TRACR_GIT_COMMIT"):
        return os.environ["TRACR_GIT_COMMIT"]
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def describe(threads: int | None = None) -> dict:
    """Python, torch, tracr versions, host, compute device, CPU and thread count."""
    import torch

    if torch.cuda.is_available():
        device = "cuda"
        accel = torch.cuda.get_device_name(0)
    elif getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        device, accel = "mps", "apple-mps"
    else:
        device, accel = "cpu", None
    return {
        "python": platform.python_version(),
        "python_impl": sys.implementation.name,
        "torch": torch.__version__,
        "tracr": experiment_design.__version__,
        "git_commit": _git_commit(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "device": device,
        "accelerator": accel,
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "threads": threads if threads is not None else torch.get_num_threads(),
        "allocator": dict(allocator.STATE),
        "pid": os.getpid(),
    }
