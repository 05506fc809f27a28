"""`tracr bench llm --placement` in the lab it states (llm-placement-lab: Qwen2.5-0.5B's
architecture, random weights, on three hosts at 0.6 / 0.6 / 0.15 core, 1.6 GB each), at
a small scale: each host's decode probe, the three policies' placements from those
figures, each run, and tracr's with two sequences in flight. The bench brings the lab
up and takes it down itself.

The assertions are structural with generous sanity bounds; the timing targets are the
bench's own (``tracr bench llm --placement --json``, see docs/guide/llm.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess

import pytest

# long: about 3 minutes of this 2-core machine (three Qwen2.5-0.5B stages deployed twice
# and the probes; the full-scale bench took 3 min 20 s), past the slow tier's budget
pytestmark = [
    pytest.mark.integration, pytest.mark.lab, pytest.mark.ssh, pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                       reason="the llm extra is not installed (make llm)"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


def test_the_placement_bench_measures_three_policies_from_probed_hosts():
    from app_api import lab
    from app_api.bench import llm as bench

    if subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.strip():
        pytest.skip("network namespaces already exist on this machine")
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--placement", "--tokens", "6", "--in-flight", "2",
                         "--probe-layers", "1"])
    try:
        r = bench.run(args)
    finally:
        lab.down()
    print(f"\nllm placement at a small scale: {r}")
    # the placement came from figures measured on each host, under its quota and cap
    assert r["placement_from"].startswith("measured")
    slow, fast = r["host_lab-3_layer_ms"], r["host_lab-1_layer_ms"]
    assert 2.0 < slow / fast < 8.0, (slow, fast)  # 0.15 against 0.6 core: about 4x
    assert r["host_lab-1_cap_bytes"] == 1_600_000_000
    assert r["tracr_hosts"][0] == "lab-3" and len(r["tracr_hosts"]) == 3
    assert r["memory_proportional_hosts"] == ["lab-1", "lab-2", "lab-3"]
    for policy in ("memory_proportional", "equal_slices", "tracr"):
        assert r[f"{policy}_tpot_ms_p50"] > 0 and r[f"{policy}_tokens_per_s"] > 0
    assert r["tracr_speedup_over_memory_proportional"] > 1.0
    assert r["in_flight_tokens_per_s_total"] > 0 and r["in_flight_bound_tokens_per_s"] > 0
    assert set(r["targets"]) == set(r["met"]) and r["exit_code"] in (0, 1)
    assert not lab.load_state()  # the bench took down the lab it brought up
