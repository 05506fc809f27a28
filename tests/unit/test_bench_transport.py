"""`tracr bench transport` end to end with a tiny payload (figures are checked for shape, not speed)."""

from __future__ import annotations

import argparse
import math

import pytest

from app_api.bench import transport

QUICK = ["--size-mb", "0.2", "--repeats", "2", "--warmup", "1", "--rtt-rounds", "3"]


def _run(extra: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    transport.add_arguments(parser)
    return transport.run(parser.parse_args(QUICK + extra))


def _check(result: dict) -> None:
    for key in (
        "throughput_ratio",
        "rtt_ratio",
        "tracr_MBps",
        "raw_MBps",
        "tracr_rtt_ms",
        "raw_rtt_ms",
    ):
        assert result[key] > 0 and math.isfinite(result[key]), key
    assert result["size_mb"] == 0.2 and result["repeats"] == 2
    assert set(result["targets"]) == {"throughput_ratio", "rtt_ratio"}
    assert result["zstd"]["compression_ratio"] > 1
    assert result["encrypted"]["MBps"] > 0 and result["encrypted"]["throughput_ratio"] > 0
    assert result["crypto_GBps"]["mac"] > 0 and result["crypto_GBps"]["encrypt"] > 0
    assert result["exit_code"] == 0


def test_bench_transport_reports_ratios_against_a_raw_socket():
    _check(_run(["--in-process"]))


@pytest.mark.integration
def test_bench_transport_with_its_peer_in_a_separate_process():
    result = _run([])
    _check(result)
    assert "separate process" in result["link"]
