"""A run's CSV files: appended row by row so a killed run keeps every completed row, cells
escaped against spreadsheet formulas, and read back without a row a crash cut off.

A write that fails (a full disk) raises :class:`ResultsWriteError`, so the run stops and
says why.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import os
from pathlib import Path
from typing import Any

from app_api.fsutil import user_owned
from experiment_design.errors import TracrError

__all__ = ["CsvStream", "ResultsWriteError", "complete_rows", "csv_text", "read_csv", "safe_cell"]

#: what a spreadsheet reads as the start of a formula (OWASP's list); such text cells get a "'"
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
#: errnos that mean "no room": the run stops and says so, without a traceback
_NO_ROOM = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}


class ResultsWriteError(TracrError):
    """A results file could not be written (disk full, file size limit, I/O error).

    Exit code 1: the run failed, the user's input was fine. ``reason`` is the short
    text summary.json's ``incomplete.reason`` carries.
    """

    exit_code = 1

    def __init__(self, path: Path, exc: OSError) -> None:
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            what = "the disk is full"
        elif exc.errno == errno.EFBIG:
            what = "the file size limit was reached"
        else:
            what = exc.strerror or str(exc)
        self.reason = f"cannot write {path.name}: {what}"
        self.path = path
        self.errno = exc.errno
        super().__init__(f"{self.reason} ({path.parent})",
                         hint="free some space (or raise the limit) and resume the run: "
                              "tracr experiment run NAME --resume RUN")

    @property
    def no_room(self) -> bool:
        """True for a full disk or a file size limit (not another I/O error)."""
        return self.errno in _NO_ROOM


def safe_cell(value: Any) -> Any:
    """A CSV cell that no spreadsheet runs as a formula: text starting with ``= + - @``,
    a tab or CR gets a leading ``'``; numbers (and text that is a number) are untouched."""
    if not isinstance(value, str) or not value.startswith(FORMULA_STARTS):
        return value
    try:
        float(value)
        return value
    except ValueError:
        return "'" + value


def csv_text(rows: list[dict], columns: list[str], header: bool = False) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    if header:
        w.writerow(columns)
    for r in rows:
        w.writerow([safe_cell(r.get(c, "")) if r.get(c) is not None else "" for c in columns])
    return buf.getvalue()


class CsvStream:
    """One append-only CSV file: each batch of rows is one write, flushed to the kernel
    at once (a killed run keeps every completed row); a write that fails is cut back to
    the last complete row, so the file stays readable."""

    def __init__(self, path: Path, columns: list[str], fresh: bool) -> None:
        self.path, self.columns = path, columns
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        if fresh:
            flags |= os.O_EXCL
        try:
            self.fd: int | None = os.open(path, flags, 0o644)
        except OSError as exc:
            raise ResultsWriteError(path, exc) from None
        user_owned(path)
        if fresh:
            self.write_text(csv_text([], columns, header=True))

    def write_text(self, text: str) -> None:
        """Append ``text`` whole, or (on an error) not at all."""
        if self.fd is None:
            raise ResultsWriteError(self.path, OSError(errno.EBADF, "the file is closed"))
        start = os.fstat(self.fd).st_size
        view = memoryview(text.encode())
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, start)
            raise ResultsWriteError(self.path, exc) from None

    def append(self, rows: list[dict]) -> None:
        """Append rows (missing columns empty, text cells made formula-safe)."""
        self.write_text(csv_text(rows, self.columns))

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


def complete_rows(path: Path) -> list[dict]:
    """The rows of a CSV file a run was writing, without a last row cut off by a crash.

    Missing file: no rows."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise TracrError(f"cannot read {path}: {exc.strerror or exc}") from None
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    if rows and not text.endswith("\n"):
        rows.pop()  # the write of the last row did not finish
    return rows


def read_csv(path: Path) -> list[dict]:
    """Rows of a CSV file as dicts of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
