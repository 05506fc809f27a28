"""`tracr bench overhead`: its ratios on the CPU, and on a GPU where there is one."""

from __future__ import annotations

import argparse

import pytest
import torch

from app_api.bench import overhead
from experiment_design.errors import TracrError


def _args(device: str = "cpu") -> argparse.Namespace:
    return argparse.Namespace(repeats=2, warmup=1, device=device)


@pytest.mark.slow
def test_cpu_reports_both_ratios_and_how_layers_were_timed():
    result = overhead.run(_args())
    assert result["device"] == "cpu" and set(result["met"]) == {
        "timing_overhead_ratio", "suffix_ratio", "sampling_overhead_ratio"}
    # per-layer timing with the participant's sampler on against off, the sampler sampling
    assert result["sampling_overhead_ratio"] > 0 and result["sampling_samples"] > 0
    assert result["sampling_passes"] == 2 * overhead.SAMPLING_BLOCK and result["sample_cpu_us"] > 0
    for name in overhead.MODELS:
        m = result["models"][name]
        assert m["timing_overhead_ratio"] > 0 and m["timing"] == "perf_counter_ns between layers"
        assert "sync_per_layer_ratio" not in m
    assert result["suffix_ratio"] > 0 and "sync_us" not in result


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where there is no GPU")
def test_cuda_without_a_gpu_says_so():
    with pytest.raises(TracrError, match="CUDA is not available") as err:
        overhead.run(_args("cuda"))
    assert "--device cpu" in err.value.hint


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_times_layers_with_events_and_measures_the_synchronize():
    result = overhead.run(_args("cuda"))
    assert result["device"] == torch.cuda.get_device_name(0)
    assert result["sync_us"] > 0 and "suffix_ratio" not in result
    for name in overhead.MODELS:
        m = result["models"][name]
        assert m["timing"].startswith("CUDA events")
        assert m["timing_overhead_ratio"] > 0 and m["sync_per_layer_ratio"] > 0
