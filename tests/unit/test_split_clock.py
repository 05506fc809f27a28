"""Per-layer clocks: host nanoseconds on the CPU, CUDA events on a GPU (one wait a pass)."""

from __future__ import annotations

import pytest
import torch

from experiment_design.split import build_split_model
from experiment_design.split.clock import (
    cpu_clock,
    cuda_event_clock,
    cuda_sync_clock,
    layer_clock,
    process_cpu_clock,
    spans_to_ms,
    ticks_to_ms,
)
from experiment_design.transport.codec import to_host


def test_the_clock_for_each_device_and_request():
    assert layer_clock(False, cuda=False) is None and layer_clock(False, cuda=True) is None
    assert layer_clock(True, cuda=False) is cpu_clock
    assert layer_clock("cpu", cuda=False) is process_cpu_clock
    assert layer_clock(True, cuda=True) is cuda_event_clock
    assert layer_clock("sync", cuda=True) is cuda_sync_clock


def test_ticks_and_spans_of_nanoseconds():
    assert ticks_to_ms(3, [0, 1_000_000, 3_500_000]) == [(3, 1.0), (4, 2.5)]
    assert ticks_to_ms(1, []) == [] and spans_to_ms([]) == []
    assert spans_to_ms([(2, 10, 2_000_010), (3, 2_000_010, 2_500_010)]) == [(2, 2.0), (3, 0.5)]


@pytest.mark.parametrize("mode", ["graph", "hooks"])
def test_both_engines_time_every_layer_on_the_cpu(mode):
    sm = build_split_model("resnet18", input_shape=(3, 32, 32), mode=mode)
    k = sm.n // 2
    crossing, edge = sm.run_prefix(k, sm.example, timed=True)
    out, cloud = sm.run_suffix(k, crossing, timed=True)
    assert [i for i, _ in edge + cloud] == list(range(1, sm.n + 1))
    assert all(ms >= 0 for _, ms in edge + cloud)


def test_a_cpu_tensor_is_its_own_host_copy():
    t = torch.arange(6.0).view(2, 3)
    assert to_host(t) is t


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["graph", "hooks"])
def test_cuda_layers_are_timed_by_events_that_add_up_to_the_pass(mode):
    import time

    sm = build_split_model("resnet18", mode=mode).to("cuda")
    x = sm.example
    with torch.inference_mode():
        for _ in range(3):
            sm.run_full(x, timed=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        _, layers = sm.run_full(x, timed=True)
        wall_ms = (time.perf_counter_ns() - t0) / 1e6  # the pass waited for its last event
    assert [i for i, _ in layers] == list(range(1, sm.n + 1))
    total = sum(ms for _, ms in layers)
    assert all(ms >= 0 for _, ms in layers) and 0 < total <= wall_ms * 1.05


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_tensor_crosses_through_pinned_host_memory():
    t = torch.randn(4, 64, 56, 56, device="cuda")[:, ::2]  # not contiguous
    host = to_host(t)
    assert host.device.type == "cpu" and host.is_pinned() and host.is_contiguous()
    assert torch.equal(host, t.cpu())
