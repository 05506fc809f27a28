"""What an SSH participant's failures mean, said in words a user can act on.

:class:`app_api.launch.ssh.SSHParticipant` hands over what it saw (ssh's exit status,
the last lines of stderr, the bootstrap's report, how long the device was silent) and
gets back the error to raise or the way the participant ended: a device that could not
be reached or logged into, an interpreter that is not there, a device that lacks torch
or blosc2, a participant that exited, or an ssh session cut off under a participant
that may still run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from app_api.devices import ssh
from app_api.devices.registry import Device
from experiment_design.errors import TracrError
from experiment_design.protocol import HEARTBEAT_S

#: what ssh writes when it loses the connection (not the participant ending)
SSH_LOST = ("not responding", "Connection reset", "Broken pipe", "Connection closed by",
            "Connection timed out", "No route to host", "Network is unreachable")
# Heartbeats come every HEARTBEAT_S; ssh gives up after ServerAliveInterval x
# ServerAliveCountMax (15 s) unanswered. Longer than a few missed beats means cut off.
SSH_GIVE_UP_SILENCE_S = 5 * HEARTBEAT_S


def cut_off(stderr: Iterable[str], returncode: int | None, silent_s: float) -> str | None:
    """``was cut off (...)`` when ssh itself gave up on the device (its keep-alives
    unanswered, the connection reset), else None: the participant may well still run
    there, and exits by itself after its idle timeout."""
    lost = next((ln for ln in reversed(list(stderr)) if any(m in ln for m in SSH_LOST)), None)
    if lost:
        return f"was cut off (ssh: {lost.strip()})"
    # ssh logs only errors, and its keep-alive timeout is not one: it exits 255 (as it
    # does for a participant killed by a signal), but a participant that died had
    # spoken a heartbeat ago, while a cut-off one went silent long before ssh gave up.
    if returncode == 255 and silent_s >= SSH_GIVE_UP_SILENCE_S:
        return f"was cut off (ssh: connection lost, nothing heard for {silent_s:.0f} s)"
    return None


def deploy_error(instance: str, role: str, device: Device, command: str, rc: int | None,
                 stderr: str, deployed: bool, what: str) -> TracrError:
    """The error for a session that ended (or was given up on) before the participant
    was ready, or after: ``what`` it did (``exited``, ``did not report ready``), with
    plumbum's block of command, host, status and stderr. ``deployed``: the bootstrap
    made its temp dir (so the interpreter ran)."""
    block = ssh.failure_block(command, device.host, rc, "", stderr)
    if rc == 255:
        status = ssh.classify_ssh_failure(stderr)
        if status:
            return ssh.ssh_error(device, status, block)
    if not deployed and (rc == 127 or "not found" in stderr or "No such file" in stderr):
        return TracrError(
            f"{instance}: python '{device.python}' not found on {device.name}\n{block}",
            hint=f"Re-pair with the right interpreter: tracr device pair --name {device.name} --python PATH",
        )
    if not deployed:
        return TracrError(f"{instance}: deploying to {device.name} failed\n{block}")
    return TracrError(f"participant {instance} ({role}) on {device.name} {what}\n{block}")


def boot_error(instance: str, device: Device, env: Mapping[str, Any],
               codec: str | None) -> TracrError | None:
    """The error for a bootstrap report (``env``) that lists a module the participant
    cannot run without, or None."""
    missing = env.get("missing") or []
    if "torch" in missing:
        return TracrError(
            f"{instance}: device {device.name} has no torch for {device.python} "
            f"(python {env.get('version')}).",
            hint=f"Install it on the device ({device.python} -m pip install torch torchvision), "
            f"or re-pair with an interpreter that has it: tracr device pair --name {device.name} --python PATH",
        )
    if "blosc2" in missing:
        return TracrError(
            f"{instance}: device {device.name} lacks blosc2, needed by codec '{codec}'.",
            hint=f"On the device: {device.python} -m pip install blosc2   (or run with --set transport.codec=none)",
        )
    return None
