"""A logging handler that keeps a participant's log records for the observer to poll."""

from __future__ import annotations

import collections
import logging
import threading
import time


class LogBuffer(logging.Handler):
    """Buffers formatted records (bounded) until :meth:`drain` hands them over."""

    def __init__(self, maxlen: int = 2000, level: int = logging.INFO) -> None:
        super().__init__(level)
        self._buf: collections.deque[dict] = collections.deque(maxlen=maxlen)
        self._lock2 = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        """Store one record as plain data."""
        try:
            msg = record.getMessage()
            if record.exc_info:
                msg += "\n" + logging.Formatter().formatException(record.exc_info)
            item = {"t": time.time(), "level": record.levelname, "name": record.name, "msg": msg}
        except Exception:  # a broken log call must never break a run
            return
        with self._lock2:
            self._buf.append(item)

    def drain(self) -> list[dict]:
        """Everything buffered since the last drain."""
        with self._lock2:
            out = list(self._buf)
            self._buf.clear()
        return out
