""":class:`ManifestError`: one clear, located problem in an experiment manifest."""

from __future__ import annotations

from experiment_design.errors import TracrError

KeyPath = tuple  # ("participant_instances", 0, "device")


def format_path(path: KeyPath) -> str:
    """``("a", 0, "b")`` -> ``"a.0.b"``, the spelling ``--set`` uses."""
    return ".".join(str(p) for p in path) or "(top level)"


class ManifestError(TracrError):
    """A manifest problem: ``file:line: key.path: message``, exit code 2.

    ``file``, ``key`` (dotted key path) and ``line`` (1-based, or None when the
    key came from a default or an override) are kept as attributes for tests
    and tools.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        key: str | None = None,
        line: int | None = None,
        hint: str | None = None,
    ) -> None:
        where = file or ""
        if where and line is not None:
            where += f":{line}"
        full = ": ".join(p for p in (where, key, message) if p)
        super().__init__(full, hint)
        self.file = file
        self.key = key
        self.line = line
        self.problem = message
