""":class:`ManifestError`: one clear, located problem in an experiment manifest."""

from __future__ import annotations

from experiment_design.errors import TracrError

KeyPath = tuple  # ("participant_instances", 0, "device")


def format_path(path: KeyPath) -> str:
    """``("a", 0, "b")`` -> ``"a.0.b"``, the spelling ``--set`` uses."""
    return ".".join(str(p) for p in path) or "(top level)"


def one_line(text: str) -> str:
    """``text`` with control characters (newlines, terminal escapes) written as escapes: a
    manifest's keys and values are echoed in errors and must not break or restyle the line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


class ManifestError(TracrError):
    """A manifest problem: ``file:line: key.path: message`` on one line, exit code 2.

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
        full = one_line(": ".join(p for p in (where, key, message) if p))
        super().__init__(full, one_line(hint) if hint else hint)
        self.file = file
        self.key = key
        self.line = line
        self.problem = message
