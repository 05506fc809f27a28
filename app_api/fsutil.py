"""Writing files safely: atomically, without following symlinks, owned by the invoking user.

Minimal version (the lab's engineer owns this module; theirs wins on merge):
:func:`atomic_write` writes a temp file next to the target, fsyncs it and
``os.replace``\\ s it in, so a reader sees the old file or the new one, never
half of one; :func:`user_owned` gives a path back to the user who ran ``sudo``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def user_owned(path: str | os.PathLike) -> None:
    """Chown ``path`` to ``SUDO_UID``/``SUDO_GID`` when running as root under sudo (else nothing)."""
    uid, gid = os.environ.get("SUDO_UID"), os.environ.get("SUDO_GID")
    if not uid or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return
    with contextlib.suppress(OSError, ValueError):
        os.chown(path, int(uid), int(gid or -1), follow_symlinks=False)


def atomic_write(path: str | os.PathLike, data: bytes | str, *, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` atomically (temp file + fsync + ``os.replace``).

    The temp file is created with ``O_EXCL | O_NOFOLLOW`` in the same directory, so a
    planted symlink is never followed; on any error it is removed and the old file,
    if any, is left as it was. Returns ``path``.
    """
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else bytes(data)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, mode)
    try:
        try:
            view = memoryview(raw)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, mode)
        user_owned(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path
