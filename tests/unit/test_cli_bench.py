"""`tracr bench NAME` prints its verdict first: each target, the figure and met/MISSED."""

from __future__ import annotations

from app_api.cli.bench import _verdict


def test_the_verdict_leads_with_every_target():
    result = {"targets": {"timing_overhead_ratio": 1.05, "suffix_ratio": 1.05},
              "timing_overhead_ratio": {"alexnet": 1.01, "resnet18": 1.07},
              "suffix_ratio": 0.98, "other": 1,
              "met": {"timing_overhead_ratio": False, "suffix_ratio": True}}
    assert _verdict(result) == [
        "timing_overhead_ratio: alexnet 1.01, resnet18 1.07 (target 1.05) MISSED",
        "suffix_ratio: 0.98 (target 1.05) met"]
    assert _verdict({"a": 1}) == []
