"""The ``tracr`` command: argument parsing, error mapping, output. Thin by design."""

from __future__ import annotations

import argparse
import logging
import sys

from app_api.cli import build_parser as build
from app_api.plugins import activate
from app_api.terminal import printable
from experiment_design.errors import TracrError

__version__ = "0.1.0"


def build_parser() -> argparse.ArgumentParser:
    """The ``tracr`` parser with every command group registered (no heavy imports)."""
    return build(__version__)


def _setup_logging(debug: bool) -> None:
    level = logging.DEBUG if debug else logging.WARNING
    try:
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(show_path=False, rich_tracebacks=debug)
        fmt = "%(message)s"
    except ImportError:  # pragma: no cover - rich is a dependency
        handler = logging.StreamHandler()
        fmt = "%(levelname)s %(name)s: %(message)s"
    handler.addFilter(_shown)
    logging.basicConfig(level=level, format=fmt, handlers=[handler])


def _shown(record: logging.LogRecord) -> bool:
    """Every log line's message with its control characters escaped: many carry a
    participant's or a device's text (an error, a warning it sent)."""
    try:
        record.msg, record.args = printable(record.getMessage()), None
    except Exception:  # noqa: BLE001 - a malformed record is logging's to report
        pass
    return True


def main(argv: list[str] | None = None) -> int:
    """Run ``tracr ARGV``; the exit code (0 ok, 1 run failed, 2 user error, 130 Ctrl-C)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.group is None else 2
    _setup_logging(args.debug)
    try:
        activate()  # installed packages' tracr.plugins entry points (app_api.plugins)
        code = args.func(args)
    except TracrError as exc:
        if args.debug:
            raise
        # a message may carry a participant's text
        print(f"error: {printable(exc.message)}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {printable(exc.hint)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
