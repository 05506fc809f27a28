"""The lab link's lock: one shaper at a time.

The lab has one link. Two ``tracr lab shape`` commands, or two shaped runs, at once
would re-shape each other's link mid-measurement, so whoever shapes holds an exclusive
``flock`` on ``/run/tracr-lab/link.lock`` (for a shaped run: for the whole run). A second
shaper waits a bounded time, then fails naming the holder::

    with link_lock(wait_s=10):
        lab.shape("4MB/s")        # re-entrant: shape() takes the same lock inside

The kernel drops a flock when its holder dies, so a killed run never strands the lab.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator

from app_api.lab import state as lab_state
from experiment_design.errors import TracrError

LOCK_NAME = "link.lock"
#: How long a second shaper waits for the first by default.
WAIT_S = 10.0

_local = threading.RLock()
_held = {"fd": None, "depth": 0}


class LabBusyError(TracrError):
    """Another tracr process is shaping (or running over) the lab link."""

    exit_code = 1


def lock_path():
    """Where the lock lives (inside the lab's root-owned directory)."""
    return lab_state.lab_dir() / LOCK_NAME


def holder() -> str:
    """Who holds the lock, as recorded in it (``pid N: command``), or ''."""
    try:
        with open(lock_path(), "rb") as f:
            return f.read(4096).decode(errors="replace").strip()
    except OSError:
        return ""


@contextlib.contextmanager
def link_lock(wait_s: float = WAIT_S) -> Iterator[None]:
    """Hold the lab link exclusively for the ``with`` body (re-entrant within a process).

    Waits at most ``wait_s`` for another holder, then raises :class:`LabBusyError`. With
    no lab up (no lab directory) there is nothing to lock and the body runs as is.
    """
    deadline = time.monotonic() + max(0.0, wait_s)
    if not _local.acquire(timeout=max(0.0, wait_s)):
        raise LabBusyError(
            "the lab link is being shaped by another thread of this tracr process",
            hint="wait for it to finish",
        )
    try:
        if _held["depth"] == 0:
            _held["fd"] = _acquire(deadline, wait_s)
        _held["depth"] += 1
        try:
            yield
        finally:
            _held["depth"] -= 1
            if _held["depth"] == 0 and _held["fd"] is not None:
                os.close(_held["fd"])  # closing the descriptor releases the flock
                _held["fd"] = None
    finally:
        _local.release()


def _acquire(deadline: float, wait_s: float) -> int | None:
    path = lock_path()
    if not lab_state.lab_dir().is_dir():
        return None
    flags = os.O_CLOEXEC | os.O_NOFOLLOW
    writer = os.access(lab_state.lab_dir(), os.W_OK)
    try:
        if writer:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o644)
        else:  # a non-root run can still take the lock on root's file, read-only
            fd = os.open(path, os.O_RDONLY | flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TracrError(f"cannot open the lab link lock {path}: {exc.strerror}") from exc
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                who = holder()
                os.close(fd)
                raise LabBusyError(
                    "the lab link is in use by another tracr process"
                    + (f" ({who})" if who else "")
                    + f"; waited {wait_s:g} s",
                    hint="wait for that run or 'tracr lab shape' to finish, then try again",
                ) from None
            time.sleep(0.05)
    if writer:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}: {_cmdline()}\n".encode(), 0)
    return fd


def _cmdline() -> str:
    try:
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
            args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    text = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(args))
    return text[:300]
