"""The one exception family tracr raises for problems a user can fix."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class TracrError(Exception):
    """A problem the user can fix: printed as one line plus a hint, exit code 2.

    ``hint`` is shown under the message; ``exit_code`` is what the CLI returns.
    """

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UnknownNameError(TracrError):
    """A name that is not in a registry; the message lists the valid ones."""

    def __init__(self, kind: str, name: str, valid: Iterable[str], hint: str | None = None):
        valid = sorted(valid)
        close = difflib.get_close_matches(name, valid, n=1)
        msg = f"Unknown {kind} '{name}'."
        if close:
            msg += f" Did you mean '{close[0]}'?"
        shown = ", ".join(valid[:40]) + (", ..." if len(valid) > 40 else "")
        msg += f" The valid options are [{shown}]."
        super().__init__(msg, hint)
        self.kind = kind
        self.name = name
        self.valid = valid
        self.closest = close[0] if close else None


class VerificationError(TracrError):
    """A split run did not reproduce the unsplit model's output."""

    exit_code = 1


def closest(name: str, valid: Iterable[str]) -> str | None:
    """The closest match to ``name`` among ``valid``, or None."""
    m = difflib.get_close_matches(name, list(valid), n=1)
    return m[0] if m else None
