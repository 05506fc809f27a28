"""How ``tracr results`` writes a figure in a table cell, and the console it prints to.

rich is imported where a cell or a console is made, for start-up time (:mod:`app_api.cli`).
"""

from __future__ import annotations

from app_api.units import format_bytes


def wide_console():
    """A rich console at least 132 columns wide (the tables do not fold into a narrow
    terminal or a pipe)."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal or console.width < 120:
        console = Console(width=max(console.width, 132))
    return console


def fixed(v, nd: int = 2) -> str:
    """``v`` with ``nd`` decimals, ``-`` for None."""
    return "-" if v is None else f"{v:.{nd}f}"


def nbytes(v) -> str:
    """A byte count in binary units (KiB, MiB: :func:`app_api.units.format_bytes`)."""
    return format_bytes(v)


def percent(v, signed: bool = False) -> str:
    """A share (0.123) as ``12.3%`` (``signed``: ``+12.3%``), ``-`` for None."""
    if v is None:
        return "-"
    return f"{v * 100:+.1f}%" if signed else f"{v * 100:.1f}%"
