"""What the observer shows while a run is going: a progress bar and live participant logs."""

from __future__ import annotations

import sys

from app_api.terminal import printable

COLORS = ["cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta"]


def log_lines(instance: str, host: str, record: dict) -> tuple[str, str, list[str]]:
    """A participant log record made safe to show: (tag, level, lines of the message).

    Every part comes from the participant, so each is passed through :func:`printable`;
    a message of several lines (a traceback) is split so that the view indents its
    continuation lines and no line can pass itself off as another participant's.
    """
    tag = printable(f"[{instance}@{host}]")
    level = printable(record.get("level", "INFO"))
    lines = printable(record.get("msg")).split("\n")
    return tag, level, lines


class ProgressView:
    """A rich progress bar (done/total, current split, ETA) plus colored participant log lines.

    With ``enabled=False`` it prints nothing but warnings and errors.
    """

    def __init__(self, enabled: bool = True, title: str = "") -> None:
        self.enabled = enabled
        self.title = title
        self._colors: dict[str, str] = {}
        self._progress = None
        self._task = None
        self.console = None
        if enabled:
            from rich.console import Console

            self.console = Console(stderr=True)

    def color(self, instance: str) -> str:
        """A stable color per participant."""
        if instance not in self._colors:
            self._colors[instance] = COLORS[len(self._colors) % len(COLORS)]
        return self._colors[instance]

    def phase(self, text: str) -> None:
        """One line per orchestration phase (deploy, warm-up, ...)."""
        if self.console:
            self.console.print(f"[bold]{text}[/bold]")

    def start(self, total: int | None) -> None:
        """Show the bar."""
        if not self.enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("split {task.fields[split]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(self.title or "inferences", total=total, split="-")

    def update(self, done: int, total: int | None, split) -> None:
        """Move the bar."""
        if self._progress is not None:
            self._progress.update(self._task, completed=done, total=total,
                                  split="-" if split is None else split)

    def log(self, instance: str, host: str, record: dict) -> None:
        """One participant log record, tagged and colored, its control characters escaped."""
        tag, level, lines = log_lines(instance, host, record)
        indent = "\n" + " " * 4
        if not self.enabled:
            if level in ("WARNING", "ERROR", "CRITICAL"):
                print(f"{tag} {level} {indent.join(lines)}", file=sys.stderr)
            return
        from rich.markup import escape

        c = self.color(instance)
        lvl = "" if level == "INFO" else f"[bold red]{escape(level)}[/] "
        text = escape(indent.join(lines))
        self.console.print(f"[{c}]{escape(tag)}[/] {lvl}{text}", emoji=False)

    def stop(self) -> None:
        """Hide the bar."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
