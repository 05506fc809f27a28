"""Probe a device: reachable, login, python, torch and accelerator, CPU, memory.

One python snippet runs on the device and prints one JSON line (no pickle).
The snippet sticks to the standard library and Python 3.6 syntax, because it
runs on whatever interpreter the device has.
"""

from __future__ import annotations

import json
import shlex
import time
from typing import Any

from app_api.devices import ssh
from app_api.devices.registry import Device
from app_api.devices.wheels import DEVICE_DEPS, PLATFORM_SNIPPET
from experiment_design.errors import TracrError

OK = "ok"
NO_TORCH = "no torch"
NO_PYTHON = "no python"
#: the modules the observer can ship as wheels; the probe records which the device has
SHIPPABLE = [m for group in DEVICE_DEPS.values() for mods in group.values() for m in mods]

PROBE_SNIPPET = PLATFORM_SNIPPET + f"SHIPPABLE = {SHIPPABLE!r}\n" + r"""
import json, os, platform, sys
info = {"python": platform.python_version(), "executable": sys.executable,
        "arch": platform.machine(), "os": platform.system(), "hostname": platform.node(),
        "cores": os.cpu_count(), "cpu": platform.processor() or platform.machine()}
try:
    for line in open("/proc/cpuinfo"):
        if line.lower().startswith(("model name", "hardware", "cpu model")):
            info["cpu"] = line.split(":", 1)[1].strip()
            break
except OSError:
    pass
try:
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            info["memory_bytes"] = int(line.split()[1]) * 1024
            break
except OSError:
    try:
        import subprocess
        info["memory_bytes"] = int(subprocess.check_output(["sysctl", "-n", "hw.memsize"]))
    except Exception:
        pass
def _version(dist):
    # metadata only: importing torchvision or blosc2 here would double the probe time
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:
        try:
            return __import__(dist).__version__
        except Exception:
            return None
for mod in ("rpyc", "blosc2", "numpy", "torchvision"):
    info[mod] = _version(mod)
# what the wheel cache must hold for this device (app_api/devices/wheels.py)
info["platform"] = _tracr_platform()
import importlib.util
info["modules"] = dict((m, importlib.util.find_spec(m) is not None) for m in SHIPPABLE)
try:
    import torch
    info["torch"] = torch.__version__
    if torch.cuda.is_available():
        info["accelerator"] = "cuda"
        info["device_name"] = torch.cuda.get_device_name(0)
        info["gpu_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        info["accelerator"] = "mps"
        info["device_name"] = "Apple MPS"
    else:
        info["accelerator"] = "cpu"
        info["device_name"] = info["cpu"]
except Exception as exc:
    info["torch"] = None
    info["torch_error"] = "%s: %s" % (type(exc).__name__, exc)
print("TRACR-PROBE " + json.dumps(info))
"""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def probe(device: Device, *, timeout: float = 60.0) -> dict[str, Any]:
    """Probe ``device`` and return its ``last_check`` dict (``status`` is always set).

    Never raises for device-side problems: they become the status
    (ok / unreachable / login failed / host key changed / host key unknown / no python / no torch).
    """
    t0 = time.perf_counter()
    result: dict[str, Any] = {"checked_at": _now()}
    if not ssh.tcp_reachable(device.host, device.port):
        result.update(
            status=ssh.UNREACHABLE, error=f"no TCP connection to {device.host}:{device.port}"
        )
        return result
    command = f"{shlex.quote(device.python)} -"
    try:
        cp = ssh.run_ssh(
            device, command, input=PROBE_SNIPPET.encode(), timeout=timeout, check=False
        )
    except TracrError as exc:
        result.update(status=ssh.UNREACHABLE, error=exc.message)
        return result
    err = cp.stderr.decode(errors="replace")
    out = cp.stdout.decode(errors="replace")
    line = next((ln for ln in out.splitlines() if ln.startswith("TRACR-PROBE ")), None)
    if line is None:
        status = ssh.classify_ssh_failure(err) if cp.returncode == 255 else None
        if status is None:
            status = NO_PYTHON if cp.returncode in (126, 127) else ssh.UNREACHABLE
        result.update(
            status=status,
            error=ssh.failure_block(
                ssh.ssh_argv(device, command), device.host, cp.returncode, out, err
            ),
        )
        return result
    info = json.loads(line[len("TRACR-PROBE ") :])
    result.update(info)
    result["status"] = OK if info.get("torch") else NO_TORCH
    result["probe_s"] = round(time.perf_counter() - t0, 3)
    return result


def probe_local(python: str | None = None) -> dict[str, Any]:
    """Probe this machine (the built-in ``localhost`` device) without SSH."""
    import subprocess
    import sys

    t0 = time.perf_counter()
    result: dict[str, Any] = {"checked_at": _now()}
    cp = subprocess.run(
        [python or sys.executable, "-"], input=PROBE_SNIPPET, capture_output=True, text=True
    )
    line = next((ln for ln in cp.stdout.splitlines() if ln.startswith("TRACR-PROBE ")), None)
    if line is None:
        result.update(status=NO_PYTHON, error=cp.stderr.strip())
        return result
    result.update(json.loads(line[len("TRACR-PROBE ") :]))
    result["status"] = OK if result.get("torch") else NO_TORCH
    result["probe_s"] = round(time.perf_counter() - t0, 3)
    return result


def describe(check: dict[str, Any] | None) -> str:
    """One-line summary of a ``last_check`` dict for tables."""
    if not check:
        return "never checked"
    if check.get("status") != OK:
        text = check.get("torch_error") or check.get("error") or ""
        return text.splitlines()[0][:80] if text else ""
    accel = check.get("accelerator", "?")
    name = check.get("device_name") or ""
    return f"torch {check.get('torch')} {accel}" + (f" ({name})" if name and accel != "cpu" else "")
