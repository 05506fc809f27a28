"""tbf sizing for the emulated lab's shaped links."""

from __future__ import annotations

import pytest

from app_api.lab.network import tbf_params
from experiment_design.errors import TracrError


def test_tbf_params_for_4MBps():
    p = tbf_params(4e6)
    assert p["rate_bit"] == 32_000_000
    assert p["burst"] == 8_000  # 2 ms of traffic
    assert p["limit"] == 8_000 + 16 * 2**20  # bucket + a queue TCP never overflows
    assert p["args"] == ["tbf", "rate", "32000000bit", "burst", "8000", "limit", "16785216"]


def test_tbf_params_slow_link_keeps_whole_frames():
    p = tbf_params(10_000)  # 80 kbit/s: 2 ms would be 20 bytes, less than one frame
    assert p["burst"] == 1514  # one full frame gets through, no more
    assert p["limit"] >= p["burst"] + 2 * 1514


def test_tbf_bucket_credits_a_transfer_at_most_two_ms_above_one_frame():
    # Regression: the bucket had a floor of four frames (6056 B), 6 ms at 1 MB/s, so on
    # the lab's 1 MB/s link a 5 KB tensor crossed in 0.17 ms (5.4 ms of bytes) and every
    # larger one ~6 ms early after an idle spell.
    for rate in (1e6, 2e6, 4e6, 64e6):
        burst = tbf_params(rate)["burst"]
        assert burst / rate <= 0.002 + 1e-9 or burst == 1514, (rate, burst)
    assert tbf_params(1e6)["burst"] == 2_000


def test_tbf_params_scale_with_rate():
    slow, fast = tbf_params(1e6), tbf_params(100e6)
    assert fast["burst"] > slow["burst"] and fast["limit"] > slow["limit"]
    assert tbf_params(1e6, queue_bytes=0)["limit"] == slow["burst"] + 2 * 1514
    with pytest.raises(TracrError):
        tbf_params(0)
