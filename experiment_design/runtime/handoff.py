"""Hand-offs between a stage's threads: bounded queues that give up once a stop flag is set.

A thread that blocks on a full or empty queue looks at the stop flag every
:data:`POLL_S`, so stopping a participant ends its threads within that time.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

#: how long a blocked queue hand-off waits before it looks at the stop flag again
POLL_S = 0.1


def put_unless_stopped(q: queue.Queue, item: Any, stop: threading.Event) -> bool:
    """Put ``item`` on a bounded queue, giving up if ``stop`` is set; True if put."""
    while not stop.is_set():
        try:
            q.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False


def get_unless_stopped(q: queue.Queue, stop: threading.Event) -> Any:
    """The next item of ``q``, or None once ``stop`` is set."""
    while not stop.is_set():
        try:
            return q.get(timeout=POLL_S)
        except queue.Empty:
            continue
    return None
