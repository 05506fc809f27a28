"""What the observer shows while a run is going: a progress bar and live participant logs."""

from __future__ import annotations

import sys

COLORS = ["cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta"]


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
        """One participant log line, tagged and colored."""
        level = record.get("level", "INFO")
        if not self.enabled:
            if level in ("WARNING", "ERROR", "CRITICAL"):
                print(f"[{instance}@{host}] {level} {record.get('msg')}", file=sys.stderr)
            return
        from rich.markup import escape

        c = self.color(instance)
        lvl = "" if level == "INFO" else f"[bold red]{level}[/] "
        self.console.print(f"[{c}]{escape(f'[{instance}@{host}]')}[/] {lvl}{escape(str(record.get('msg')))}")

    def stop(self) -> None:
        """Hide the bar."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
