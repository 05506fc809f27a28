"""Rate parsing and tbf sizing for the emulated lab."""

from __future__ import annotations

import pytest

from app_api.lab.rates import format_rate, parse_rate, tbf_params
from experiment_design.errors import TracrError


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4MB/s", 4_000_000),
        ("1.5MB/s", 1_500_000),
        ("32Mbit", 4_000_000),
        ("32 Mbit/s", 4_000_000),
        ("100mbps", 12_500_000),
        ("100Mbps", 12_500_000),
        ("4MBps", 4_000_000),
        ("500kbit", 62_500),
        ("1MiB/s", 1_048_576),
        ("1Gbit", 125_000_000),
        ("4000000", 4_000_000),
        ("2e6", 2_000_000),
        ("250B/s", 250),
        (1234, 1234),
        (2.5e6, 2_500_000),
    ],
)
def test_parse_rate(text, expected):
    assert parse_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text", ["", "fast", "4M", "4 parsecs", "-1MB/s", "0", "0MB/s", "4MBPS", "nan"]
)
def test_parse_rate_rejects(text):
    with pytest.raises(TracrError) as err:
        parse_rate(text)
    assert err.value.hint  # every rejection says how to write a rate
    assert err.value.exit_code == 2


def test_parse_rate_rejects_bool():
    with pytest.raises(TracrError):
        parse_rate(True)


def test_format_rate_names_both_units():
    assert format_rate(4e6) == "4 MB/s (32 Mbit/s)"
    assert format_rate(62_500) == "62.5 kB/s (500 kbit/s)"
    assert format_rate(None) == "-"


def test_tbf_params_for_4MBps():
    p = tbf_params(4e6)
    assert p["rate_bit"] == 32_000_000
    assert p["burst"] == 8_000  # 2 ms of traffic
    assert p["limit"] == 8_000 + 16 * 2**20  # bucket + a queue TCP never overflows
    assert p["args"] == ["tbf", "rate", "32000000bit", "burst", "8000", "limit", "16785216"]


def test_tbf_params_slow_link_keeps_whole_frames():
    p = tbf_params(10_000)  # 80 kbit/s: 2 ms would be 20 bytes, less than one frame
    assert p["burst"] >= 4 * 1514
    assert p["limit"] >= p["burst"] + 2 * 1514


def test_tbf_params_scale_with_rate():
    slow, fast = tbf_params(1e6), tbf_params(100e6)
    assert fast["burst"] > slow["burst"] and fast["limit"] > slow["limit"]
    assert tbf_params(1e6, queue_bytes=0)["limit"] == slow["burst"] + 2 * 1514
    with pytest.raises(TracrError):
        tbf_params(0)
