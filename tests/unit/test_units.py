"""Reading link rates (the one parser the manifest and the lab share) and printing them."""

from __future__ import annotations

import pytest

from app_api.units import format_rate, parse_rate
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


@pytest.mark.parametrize(
    "text,bps",
    [("4MB/s", 4e6), ("100Mbit", 12.5e6), ("1Gbps", 125e6), ("512 kB/s", 512e3), ("1MiB/s", 2**20)],
)
def test_parse_bandwidth(text, bps):
    assert parse_rate(text) == pytest.approx(bps)


def test_sizes_are_printed_in_binary_units_and_say_so():
    from app_api.units import format_bytes

    # 602,112 bytes (a 224x224x3 float32 input) printed as "588.0 KB" read as 10^3 bytes
    assert format_bytes(602_112) == "588.0 KiB"
    assert format_bytes(512) == "512 B" and format_bytes(None) == "-"
    assert format_bytes(3 * 1024**3) == "3.0 GiB"
