"""Link rates: parsing what users type (``4MB/s``, ``32Mbit``) and sizing ``tbf``.

Units, stated once so the CLI help can quote them: ``B`` is a byte and ``b``/``bit``
a bit; ``k``/``M``/``G`` are powers of 1000 (``MB`` = 10^6 bytes), ``Ki``/``Mi``/``Gi``
powers of 1024. ``bps`` means *bits* per second (``100mbps`` = 12.5 MB/s), unlike
``tc``'s own syntax where ``mbps`` means megabytes. A plain number is bytes per second.
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


#: Bytes the shaper may queue. Deep enough that TCP never loses a packet to it: Linux
#: lets one flow have at most its send buffer in flight (``tcp_wmem`` max, 4 MiB by
#: default), so every request-response transfer fits, for a few flows at once.
QUEUE_BYTES = 16 << 20


def tbf_params(rate_Bps: float, *, mtu: int = 1500, queue_bytes: int = QUEUE_BYTES) -> dict:
    """Parameters for a ``tbf`` qdisc shaping to ``rate_Bps`` (bytes/s on the wire).

    ``burst`` (the bucket) is 2 ms worth of traffic but never less than 4 full frames.
    The bucket refills while the link idles and is then sent at line rate, so a big
    bucket would make every small tensor transfer look faster than the configured rate;
    2 ms keeps that error small while TCP still reaches ~95% of the rate in payload.
    ``limit`` (the queue) is one bucket plus ``queue_bytes``, so a transfer takes
    bytes / rate however large it is. With a shallow queue (50 ms of traffic) the tail
    of every transfer larger than the queue was dropped and TCP recovered by
    retransmission timeout (>= 200 ms): on a 1 MB/s link a 62 KB tensor took 200 ms
    instead of 63 ms, and the time stopped growing with the bytes.
    Returned as integers plus the ready ``tc`` argument list.
    """
    if not rate_Bps > 0:
        raise TracrError(f"cannot shape to a rate of {rate_Bps} bytes/s")
    frame = mtu + 14
    burst = max(4 * frame, int(rate_Bps * 0.002))
    limit = burst + max(2 * frame, int(queue_bytes))
    rate_bit = int(round(rate_Bps * 8))
    return {
        "rate_bit": rate_bit,
        "burst": burst,
        "limit": limit,
        "args": ["tbf", "rate", f"{rate_bit}bit", "burst", str(burst), "limit", str(limit)],
    }


def _bad(text: str, hint: str | None = None) -> TracrError:
    return TracrError(f"cannot read the rate '{text}'", hint=hint or RATE_HELP)
