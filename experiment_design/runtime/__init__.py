"""Low-level participant support the roles use: control auth, ``@control``, log capture,
environment report, allocator. The process entry point is ``experiment_design.participant``
(it imports the roles, so it cannot live in a package the roles import).

``connect_control(host, port, secret)`` is the observer's way in: an rpyc
connection that has passed the HMAC challenge first.
"""

from __future__ import annotations

from typing import Any

from experiment_design.runtime.auth import connect_control as _connect


def connect_control(host: str, port: int, secret: bytes, timeout: float = 10.0) -> Any:
    """Open an authenticated rpyc control connection to a participant."""
    return _connect(host, port, secret, timeout=timeout)


__all__ = ["connect_control"]
