"""Writing files safely, and on behalf of the user who ran ``sudo``.

tracr runs as the researcher, or as root through ``sudo -E tracr ...`` (the lab needs
root). Every file it writes for the researcher (the device registry, known_hosts,
results) must then still belong to the researcher, or their next command without
sudo fails. And a root process writing into a directory a user controls must never
follow a link planted there. So every write here:

- goes to a temporary file created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` in the
  target's own directory, is flushed to disk, and replaces the target with
  ``os.replace`` (a reader sees the old file or the new one, never half of one);
- works through a descriptor of the parent directory opened with ``O_NOFOLLOW``, so
  neither the file nor its directory can be swapped for a link in between;
- under sudo (euid 0 and ``SUDO_UID`` set), gives the new file, and every directory
  it had to create, to ``SUDO_UID``/``SUDO_GID``.

A file or directory left root-owned by an older tracr gives a :class:`TracrError`
saying which path and how to fix it, not a ``PermissionError`` traceback::

    from app_api.fsutil import atomic_write, user_owned
    atomic_write(cfg / "devices.yaml", text, mode=0o600)
    run_dir = user_owned(results / "run-1")   # mkdir -p, owned by the invoking user
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from experiment_design.errors import TracrError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def invoking_user() -> tuple[int, int] | None:
    """``(uid, gid)`` of the user who ran ``sudo``, when we run as root under sudo; else None.

    Only an unprivileged ``SUDO_UID`` counts: ``sudo`` run by root changes nothing.
    """
    if os.geteuid() != 0:
        return None
    try:
        uid = int(os.environ["SUDO_UID"])
    except (KeyError, ValueError):
        return None
    if uid <= 0:
        return None
    try:
        gid = int(os.environ.get("SUDO_GID", ""))
    except ValueError:
        import pwd

        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = uid
    return uid, gid


def permission_error(path: str | os.PathLike, exc: OSError | None = None) -> TracrError:
    """The clear error for a path tracr cannot write or read (root-owned by an older tracr)."""
    path = Path(path)
    owner = _owner_name(path)
    who = f" (owned by {owner})" if owner else ""
    reason = f": {exc.strerror}" if exc is not None and exc.strerror else ""
    return TracrError(
        f"cannot write or read {path}{who}{reason}",
        hint=(
            "it was probably created by an older tracr run under sudo; give it back with "
            f"'sudo chown -R $USER {path}'"
            if owner == "root"
            else "check its owner and permissions"
        ),
    )


def _owner_name(path: Path) -> str | None:
    for p in (path, *path.parents):
        try:
            st = os.lstat(p)
        except OSError:
            continue
        try:
            import pwd

            return pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            return str(st.st_uid)
    return None


@contextlib.contextmanager
def _translate_permission(path: Path) -> Iterator[None]:
    try:
        yield
    except PermissionError as exc:
        raise permission_error(exc.filename or path, exc) from exc


def open_dir(path: str | os.PathLike) -> int:
    """A descriptor of directory ``path``, refusing a symbolic link as its last component."""
    return os.open(os.fspath(path), os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)


def _chown_fd(fd: int, owner: tuple[int, int] | None) -> None:
    if owner is not None:
        os.fchown(fd, *owner)


def ensure_dir(path: str | os.PathLike, mode: int = 0o755) -> Path:
    """``mkdir -p path``; every directory created is given to the invoking user under sudo.

    Directories that already exist keep their owner and mode. A symbolic link as the last
    component is refused (``NotADirectoryError`` becomes a TracrError).
    """
    path = Path(path).expanduser()
    owner = invoking_user()
    missing: list[Path] = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    with _translate_permission(path):
        for d in reversed(missing):
            try:
                os.mkdir(d, mode)
            except FileExistsError:
                continue  # created meanwhile by someone else: keep its owner
            fd = open_dir(d)
            try:
                _chown_fd(fd, owner)
            finally:
                os.close(fd)
        try:
            os.close(open_dir(path))
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise TracrError(
                    f"{path} is not a directory (a symbolic link or a file is in the way)",
                    hint="remove it, or point tracr elsewhere",
                ) from exc
            raise
    return path


def user_owned(path: str | os.PathLike, mode: int = 0o755) -> Path:
    """Make ``path`` an existing directory that belongs to the invoking user; return it.

    Like :func:`ensure_dir`, and an existing directory (e.g. a run directory just made by
    root under sudo) is given to the invoking user as well. Outside sudo this is
    ``mkdir -p``. An existing file (a results CSV opened by root) is given to the user
    as it is. Links are never followed.
    """
    p = Path(path).expanduser()
    if os.path.lexists(p) and (p.is_symlink() or not p.is_dir()):
        owner = invoking_user()
        if owner is not None:
            with _translate_permission(p):
                os.chown(p, *owner, follow_symlinks=False)
        return p
    path = ensure_dir(p, mode)
    owner = invoking_user()
    if owner is not None:
        fd = open_dir(path)
        try:
            _chown_fd(fd, owner)
        finally:
            os.close(fd)
    return path


def atomic_write(
    path: str | os.PathLike, data: bytes | str, *, mode: int = 0o644, for_user: bool = True
) -> Path:
    """Write ``data`` to ``path`` atomically (temp file + ``os.replace``); return the path.

    The temporary file is created next to ``path`` with ``O_EXCL | O_NOFOLLOW``, gets
    ``mode``, is fsync'ed, then renamed over ``path`` through a descriptor of the
    directory (a link planted at ``path`` is replaced, never followed). Missing parent
    directories are created. Under sudo the file (and the directories created) belong to
    the invoking user; ``for_user=False`` keeps them root's (the lab's own secrets).
    A kill or a full disk leaves the old file, never a truncated one.
    """
    path = Path(path).expanduser()
    payload = data.encode() if isinstance(data, str) else bytes(data)
    owner = invoking_user() if for_user else None
    if for_user:
        ensure_dir(path.parent)
    else:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _translate_permission(path):
        dfd = open_dir(path.parent)
        try:
            tmp = f".{path.name}.{secrets.token_hex(6)}.tmp"
            fd = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC,
                0o600,
                dir_fd=dfd,
            )
            try:
                try:
                    view = memoryview(payload)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fchmod(fd, mode)
                    _chown_fd(fd, owner)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
                raise
            with contextlib.suppress(OSError):
                os.fsync(dfd)  # the rename itself survives a crash
        finally:
            os.close(dfd)
    return path


def read_text(path: str | os.PathLike) -> str | None:
    """The text of ``path`` (None if it does not exist), refusing a symbolic link.

    An unreadable file (root-owned by an older tracr) is a TracrError saying how to fix it.
    """
    path = Path(path).expanduser()
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
    except FileNotFoundError:
        return None
    except PermissionError as exc:
        raise permission_error(path, exc) from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TracrError(
                f"{path} is a symbolic link; tracr does not follow links for its own files",
                hint="replace it with a regular file",
            ) from exc
        raise
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise TracrError(f"{path} is not a regular file")
        return fh.read().decode("utf-8", errors="replace")


def unlink(path: str | os.PathLike) -> bool:
    """Remove the file ``path`` (a link is removed, never its target); True if it existed."""
    path = Path(path)
    try:
        dfd = open_dir(path.parent)
    except OSError:
        return False
    try:
        os.unlink(path.name, dir_fd=dfd)
        return True
    except (FileNotFoundError, IsADirectoryError):
        return False
    finally:
        os.close(dfd)


def safe_dir(path: str | os.PathLike, *, owners: tuple[int, ...] = (0,)) -> bool:
    """True if ``path`` is a real directory owned by one of ``owners``, writable only by its owner.

    Used before root trusts a directory's contents (sshd keys, the lab's state).
    """
    try:
        st = os.lstat(path)
    except OSError:
        return False
    writable_by_others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return stat.S_ISDIR(st.st_mode) and st.st_uid in owners and not writable_by_others


def atomic_csv(path: str | os.PathLike, columns: list[str], rows) -> Path:
    """Write ``rows`` (mappings) as a CSV of ``columns`` (other keys ignored), atomically."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    atomic_write(Path(path), buf.getvalue())
    return Path(path)
