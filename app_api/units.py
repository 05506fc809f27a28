"""Link rates written by people (``4MB/s``, ``32Mbit``, ``100mbps``), read one way everywhere.

Units, stated once so the CLI help can quote them: ``B`` is a byte and ``b``/``bit``
a bit; ``k``/``M``/``G`` are powers of 1000 (``MB`` = 10^6 bytes), ``Ki``/``Mi``/``Gi``
powers of 1024. ``bps`` means *bits* per second (``100mbps`` = 12.5 MB/s), unlike
``tc``'s own syntax where ``mbps`` means megabytes. A plain number is bytes per second.

The manifest (``network.bandwidth``) and the emulated lab (``tracr lab up --bandwidth``)
both parse with :func:`parse_rate`; memory caps (``tracr lab up --memory``, the manifest's
``lab.memory``) with :func:`parse_size` and :func:`parse_limits`. This module imports nothing
heavier than the error type.
"""

from __future__ import annotations

import re

from experiment_design.errors import TracrError

RATE_HELP = (
    "rate as 4MB/s, 1.5MB/s, 32Mbit, 100mbps, 500kbit or a plain number of bytes/s; "
    "MB = 10^6 bytes, MiB = 2^20 bytes, 'bps'/'bit' = bits per second"
)

_PREFIX = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}
_BYTE_UNITS = {"B", "B/s", "Bps", "byte/s", "bytes/s", "Byte/s", "Bytes/s"}
_BIT_UNITS = {"b", "b/s", "bps", "bit", "bits", "bit/s", "bits/s", "bitps"}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d+))?\s*([kKmMgGtT]i?)?\s*(\S*)\s*$")

ETH_OVERHEAD = 1514 / 1448
"""Bytes on the wire per byte of TCP payload at MTU 1500 (headers + timestamps)."""


def parse_rate(text: str | int | float) -> float:
    """Bytes per second for a rate such as ``4MB/s``, ``32Mbit``, ``100mbps`` or ``4000000``.

    A rate that cannot be read raises :class:`TracrError` (exit code 2) whose hint
    says how to write one.

    >>> parse_rate("4MB/s"), parse_rate("32Mbit"), parse_rate("100mbps")
    (4000000.0, 4000000.0, 12500000.0)
    """
    if isinstance(text, bool):
        raise _bad(str(text))
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _RATE_RE.match(str(text))
        if not m:
            raise _bad(str(text))
        number, exponent, prefix, unit = m.groups()
        value = float(number) * (10 ** int(exponent) if exponent else 1)
        prefix = (prefix or "").lower()
        if unit == "" and prefix:
            # "4M" could be bits or bytes; refuse to guess.
            raise _bad(str(text), "say 4MB/s (bytes) or 4Mbit (bits)")
        if unit in _BYTE_UNITS or unit == "":
            factor = 1.0
        elif unit in _BIT_UNITS or unit.lower() in {"bit", "bits", "bit/s", "bits/s"}:
            factor = 1 / 8
        else:
            raise _bad(str(text))
        value *= _PREFIX[prefix] * factor
    if not value > 0 or value != value or value == float("inf"):
        raise _bad(str(text), "the rate must be a positive number")
    return value


def format_bytes(n: float | None) -> str:
    """``512 B``, ``588.0 KiB``, ``1.5 MiB``: 1024-based, and named so (a size printed as
    ``KB`` read as 10^3 bytes where rates are 10^6-based ``MB/s``); ``-`` for None."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_rate(bytes_per_s: float | None) -> str:
    """``4.00 MB/s (32.0 Mbit/s)``: both units, so nobody has to guess which one is meant."""
    if bytes_per_s is None:
        return "-"
    for div, name in ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"), (1, "B/s")):
        if bytes_per_s >= div or div == 1:
            bits = bytes_per_s * 8
            bdiv, bname = next(
                (d, n)
                for d, n in ((1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s"), (1, "bit/s"))
                if bits >= d or d == 1
            )
            return f"{bytes_per_s / div:.3g} {name} ({bits / bdiv:.3g} {bname})"
    raise AssertionError("unreachable")


def _bad(text: str, hint: str | None = None) -> TracrError:
    return TracrError(f"cannot read the rate '{text}'", hint=hint or RATE_HELP)


# ----- memory sizes (tracr lab up --memory, the manifest's lab.memory) -----------------
#: the smallest cap: below it a host's sshd alone would not start a session
MIN_BYTES = 16 * 1024 * 1024
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int | float) -> int:
    """Bytes of ``600MB``, ``1.5GB``, ``512MiB`` or a plain number of bytes (MB = 10^6,
    MiB = 2^20)."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return int(text)
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise TracrError(f"cannot read the memory size {text!r}",
                         hint="sizes look like 600MB, 1.5GB or 512MiB")
    return int(float(m.group(1)) * _UNITS[unit])


def parse_limits(items: list[str] | dict | None, hosts: int) -> dict[str, int]:
    """``{host: bytes}`` from ``["lab-1=600MB", ...]`` (or a dict), hosts checked."""
    if not items:
        return {}
    pairs = items.items() if isinstance(items, dict) else (_split_cap(i) for i in items)
    valid = [f"lab-{i}" for i in range(1, hosts + 1)]
    out = {}
    for name, value in pairs:
        if name not in valid:
            raise TracrError(f"no lab host {name!r} to cap",
                             hint=f"the hosts are {', '.join(valid)}; caps look like "
                                  "lab-1=600MB")
        size = parse_size(value)
        if size < MIN_BYTES:
            raise TracrError(f"a memory cap of {size} bytes for {name} is below "
                             f"{MIN_BYTES // 2**20} MiB, too little for its sshd")
        out[name] = size
    return out


def _split_cap(item: str) -> tuple[str, str]:
    name, sep, value = str(item).partition("=")
    if not sep or not name or not value:
        raise TracrError(f"cannot read the memory cap {item!r}", hint="lab-1=600MB")
    return name.strip(), value.strip()
