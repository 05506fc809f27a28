"""A split output against the unsplit model's: top-1 agreement, cosine, max abs difference."""

from __future__ import annotations

import pytest
import torch

from experiment_design.runtime.fidelity import compare, reference_outputs, transport_label
from experiment_design.transport import CodecConfig


def test_identical_outputs_are_exact():
    ref = [torch.randn(1, 10, generator=torch.Generator().manual_seed(0))]
    assert compare([ref[0].clone()], ref) == {"top1_agree": 1, "cosine": 1.0,
                                               "max_abs_diff": 0.0}


def test_a_perturbed_output_is_measured_in_float64():
    ref = [torch.tensor([[0.0, 3.0, 1.0]]), torch.tensor([2.0])]
    out = [torch.tensor([[0.0, 3.0, 1.5]], dtype=torch.float16), torch.tensor([2.0])]
    got = compare(out, ref)
    a = torch.tensor([0.0, 3.0, 1.5, 2.0], dtype=torch.float64)
    b = torch.tensor([0.0, 3.0, 1.0, 2.0], dtype=torch.float64)
    assert got["top1_agree"] == 1 and got["max_abs_diff"] == 0.5
    assert got["cosine"] == pytest.approx(float(a.dot(b) / (a.norm() * b.norm())), abs=1e-15)
    flipped = compare([torch.tensor([[0.0, 1.0, 3.0]]), torch.tensor([2.0])], ref)
    assert flipped["top1_agree"] == 0 and flipped["cosine"] < 1.0


def test_outputs_that_do_not_match_the_reference_compare_as_nothing():
    ref = [torch.zeros(1, 4)]
    assert compare([torch.zeros(1, 5)], ref) == {}
    assert compare([], ref) == {}
    assert compare([torch.zeros(1, 4), torch.zeros(1)], ref) == {}


def test_reference_is_the_unsplit_output_per_input():
    from experiment_design.split import build_split_model

    torch.manual_seed(0)
    sm = build_split_model("alexnet", seed=0)
    xs = [(torch.randn(1, 3, 224, 224), None, f"i{i}") for i in range(2)]
    refs = reference_outputs(sm, xs)
    assert set(refs) == {id(x) for x, _, _ in xs}
    with torch.inference_mode():
        y, _ = sm.run_full(xs[1][0], timed=False)
    assert compare([y], refs[id(xs[1][0])])["max_abs_diff"] == 0.0


def test_transport_labels_are_the_configs_own_else_derived():
    from types import SimpleNamespace

    assert transport_label(SimpleNamespace(label="int8+zstd-1")) == "int8+zstd-1"
    assert transport_label(SimpleNamespace(codec="zstd", level=1)) == "zstd-1"
    assert transport_label(SimpleNamespace(codec="none", level=0)) == "raw"
    assert transport_label(None) == "raw"
    assert transport_label(CodecConfig(codec="lz4", level=5)).startswith("lz4")
