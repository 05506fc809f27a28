"""Parsing link rates written by people: ``"4MB/s"``, ``"100Mbit"``, ``"512 kbps"``."""

from __future__ import annotations

import re

_RATE = re.compile(
    r"^\s*(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<prefix>[kKmMgGtT]?)(?P<binary>i?)"
    r"(?P<unit>B/s|Bps|B|bit/s|bits/s|bit|bps|b/s)\s*$"
)
_PREFIX = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def _lab_parser():
    """The emulated lab's own parser when installed, so both read a rate the same way."""
    try:
        from app_api.lab.rates import parse_rate
    except ModuleNotFoundError as exc:
        if exc.name in ("app_api.lab", "app_api.lab.rates"):
            return None
        raise
    return parse_rate


def parse_bandwidth(text: str | float) -> float:
    """Bytes per second for a rate string.

    Upper-case ``B`` means bytes, ``bit``/``bps``/``b/s`` bits; prefixes k/M/G/T
    are powers of 1000, ``Ki``/``Mi``/... powers of 1024 (as in ``tc``)::

        >>> parse_bandwidth("4MB/s")
        4000000.0
        >>> parse_bandwidth("100Mbit")
        12500000.0
    """
    lab = _lab_parser()
    if lab is not None:
        from experiment_design.errors import TracrError

        try:
            return lab(text)
        except TracrError as exc:
            raise ValueError(f"{exc.message} ({exc.hint})" if exc.hint else exc.message) from None
    m = _RATE.match(str(text))
    if not m:
        raise ValueError(
            f"cannot read rate {text!r}; write e.g. '4MB/s', '500kB/s', '100Mbit', '1Gbps'"
        )
    base = 1024 if m["binary"] else 1000
    value = float(m["num"]) * base ** _PREFIX[m["prefix"].lower()]
    if m["unit"] in ("B/s", "Bps", "B"):
        return value
    return value / 8
