"""Split engine behaviour beyond the central equality check."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from experiment_design.errors import TracrError
from experiment_design.models import create_model, list_models
from experiment_design.split import SplitModel, build_split_model, flatten_output, max_abs_diff

TOL = 1e-5


@pytest.fixture(scope="module")
def resnet18():
    torch.set_num_threads(1)
    model = create_model("resnet18")
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return model, x


def _check_all(sm: SplitModel, model: nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        ref = model(x)
    for k in sm.valid_splits():
        crossing, _ = sm.run_prefix(k, x)
        out, _ = sm.run_suffix(k, crossing)
        assert max_abs_diff(out, ref) <= TOL, k


def test_resnet18_skip_connection_crosses_and_is_sent_once(resnet18):
    model, x = resnet18
    sm = SplitModel.build(model, x)
    assert sm.mode == "graph"
    multi = [p for p in sm.points if len(p.crossing) > 1]
    assert multi, "a cut inside a residual block must send the skip tensor too"
    for p in sm.points:
        assert len(set(p.crossing)) == len(p.crossing)
    k = multi[0].index
    crossing, _ = sm.run_prefix(k, x)
    assert sm.points[k].crossing_bytes == sum(t.numel() * 4 for t in crossing.values())


def test_depth_one_matches_torchinfo_top_level(resnet18):
    model, x = resnet18
    sm = SplitModel.build(model, x, depth=1)
    assert [layer.name for layer in sm.layers] == [
        "conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4",
        "avgpool", "flatten", "fc",
    ]  # fmt: skip
    sm2 = SplitModel.build(model, x, depth=2)
    assert "layer1.0" in [layer.name for layer in sm2.layers]
    _check_all(sm2, model, x)


@pytest.mark.parametrize("depth", [0, -1, 99])
def test_bad_depth_is_a_user_error(resnet18, depth):
    model, x = resnet18
    with pytest.raises(TracrError, match="depth"):
        SplitModel.build(model, x, depth=depth)


@pytest.mark.parametrize("depth", [None, 2])
def test_hooks_mode_on_resnet18(resnet18, depth):
    model, x = resnet18
    sm = SplitModel.build(model, x, mode="hooks", depth=depth)
    assert sm.mode == "hooks"
    assert sm.n >= 10
    _check_all(sm, model, x)


def _convolutions_computed(model: nn.Module, fn) -> list[str]:
    """Names of the Conv2d modules that actually convolve while ``fn`` runs (stubs do not)."""
    names = {id(m): n for n, m in model.named_modules()}
    calls: list[str] = []
    real = nn.Conv2d._conv_forward

    def spy(self, *args, **kwargs):
        calls.append(names[id(self)])
        return real(self, *args, **kwargs)

    nn.Conv2d._conv_forward = spy
    try:
        fn()
    finally:
        nn.Conv2d._conv_forward = real
    return calls


def test_hooks_suffix_does_not_recompute_prefix(resnet18):
    model, x = resnet18
    sm = SplitModel.build(model, x, mode="hooks", depth=1)
    k = [p.index for p in sm.points if p.layer == "layer2"][0]
    crossing, _ = sm.run_prefix(k, x)
    calls = _convolutions_computed(model, lambda: sm.run_suffix(k, crossing))
    assert calls and all(not n.startswith(("conv1", "layer1", "layer2")) for n in calls)


def test_graph_suffix_does_not_recompute_prefix(resnet18):
    model, x = resnet18
    sm = SplitModel.build(model, x)
    k = [p.index for p in sm.points if p.layer == "layer3.0.conv1"][0]
    crossing, _ = sm.run_prefix(k, x)
    calls = _convolutions_computed(model, lambda: sm.run_suffix(k, crossing))
    assert calls[0] == "layer3.0.conv2"
    assert all(not n.startswith(("conv1", "layer1", "layer2")) for n in calls)


def test_prepare_builds_each_side_before_the_first_inference(resnet18, monkeypatch):
    model, x = resnet18
    sm = SplitModel.build(model, x)
    valid = sm.valid_splits()
    assert sm.prepare("prefix") == len(valid)
    assert sm.prepare("suffix", valid[:3]) == 3
    built: list[tuple[int, str]] = []
    compile_ = sm.engine._compile
    monkeypatch.setattr(sm.engine, "_compile",
                        lambda k, side, clock: built.append((k, side)) or compile_(k, side, clock))
    for k in valid:  # timed prefixes were built ahead: nothing is generated inside the timing
        sm.run_prefix(k, x, timed=True)
    assert built == []
    crossing, _ = sm.run_prefix(valid[5], x, timed=True)
    sm.run_suffix(valid[5], crossing, timed=True)  # not prepared: built on first use
    assert built == [(valid[5], "suffix")]
    with pytest.raises(TracrError, match="unknown side"):
        sm.prepare("middle")
    with pytest.raises(TracrError, match="out of range"):
        sm.prepare("prefix", [sm.n + 1])
    assert SplitModel.build(model, x, mode="hooks", depth=1).prepare("prefix") == 0


def test_forced_graph_mode_on_untraceable_model_is_a_user_error():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)

        def forward(self, x):
            y = self.a(x)
            if y.sum() > 0:  # data-dependent: fx cannot trace it
                y = y * 2
            return self.b(y)

    model = Branchy().eval()
    x = torch.randn(2, 4)
    with pytest.raises(TracrError, match="cannot trace"):
        SplitModel.build(model, x, mode="graph")
    sm = SplitModel.build(model, x)  # auto falls back
    assert sm.mode == "hooks"
    _check_all(sm, model, x)


def test_a_size_crossing_a_cut_keeps_it_valid():
    class SizeUser(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            b = x.size(0)
            y = self.conv(x)
            return y.view(b, -1)

    model = SizeUser().eval()
    x = torch.randn(2, 3, 8, 8)
    sm = SplitModel.build(model, x)
    # plain data (an int here) crosses beside the tensors; see test_split_plain.py
    assert sm.valid_splits() == list(range(sm.n + 1))
    crossing, _ = sm.run_prefix(1, x)
    assert crossing["size"] == 2 and type(crossing["size"]) is int
    _check_all(sm, model, x)


def test_timed_runs_cover_every_layer_once(resnet18):
    model, x = resnet18
    sm = SplitModel.build(model, x)
    k = sm.n // 2
    crossing, edge = sm.run_prefix(k, x, timed=True)
    out, cloud = sm.run_suffix(k, crossing, timed=True)
    assert [i for i, _ in edge + cloud] == list(range(1, sm.n + 1))
    assert all(ms >= 0 for _, ms in edge + cloud)
    full, times = sm.run_full(x, timed=True)
    assert len(times) == sm.n
    with torch.no_grad():
        assert max_abs_diff(full, model(x)) <= TOL
        assert max_abs_diff(out, model(x)) <= TOL


@pytest.mark.slow
def test_torchvision_model_by_name():
    sm = build_split_model("torchvision:shufflenet_v2_x0_5", input_shape=(3, 32, 32))
    assert sm.n > 20
    assert len(sm.valid_splits()) == len(sm.points)  # channel_shuffle's size() ints cross too
    with torch.no_grad():
        ref = sm.model(sm.example)
    for k in sm.valid_splits():
        out, _ = sm.run_suffix(k, sm.run_prefix(k, sm.example)[0])
        assert max_abs_diff(out, ref) <= TOL, k


@pytest.mark.skipif("yolov8n" not in list_models(), reason="ultralytics not installed")
def test_yolov8n_hooks_splits_cross_skip_connections():
    sm = build_split_model("yolov8n", input_shape=(3, 160, 160))
    assert sm.mode == "hooks"
    multi = [p for p in sm.points if p.valid and len(p.crossing) > 1]
    assert multi
    with torch.no_grad():
        ref = sm.model(sm.example)
    for p in multi[:: max(1, len(multi) // 4)]:
        assert sm.verify(p.index, sm.example) <= TOL
        crossing, _ = sm.run_prefix(p.index, sm.example)
        assert len(crossing) > 1
    assert len(flatten_output(ref)) > 1


def test_flatten_and_diff_on_nested_outputs():
    a = (torch.ones(2), {"x": [torch.zeros(1), torch.ones(3)]})
    b = (torch.ones(2), {"x": [torch.zeros(1), torch.full((3,), 1.5)]})
    assert len(flatten_output(a)) == 3
    assert max_abs_diff(a, b) == pytest.approx(0.5)
    assert max_abs_diff(a, (torch.ones(2),)) == float("inf")


def test_bad_mode_and_split_index(resnet18):
    model, x = resnet18
    with pytest.raises(TracrError, match="mode"):
        SplitModel.build(model, x, mode="magic")
    sm = SplitModel.build(model, x)
    with pytest.raises(TracrError, match="out of range"):
        sm.run_prefix(sm.n + 1, x)


def test_to_places_the_model_and_resolves_auto(resnet18):
    model, x = resnet18
    sm = SplitModel.build(model, x)
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert sm.to("auto") is sm and sm.device.type == want
    assert next(sm.model.parameters()).device.type == want and sm.example.device.type == want
    sm.to("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(TracrError, match="CUDA is not available"):
            sm.to("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_timed_split_matches(resnet18):
    model, x = resnet18
    sm = SplitModel.build(create_model("resnet18"), x).to("cuda")
    xc = x.cuda()
    k = sm.n // 2
    crossing, edge = sm.run_prefix(k, xc, timed=True)
    out, cloud = sm.run_suffix(k, crossing, timed=True)
    assert len(edge) + len(cloud) == sm.n
    with torch.no_grad():
        assert max_abs_diff(out, model(x)) <= 1e-3  # cuDNN picks other kernels than the CPU


def test_hooks_mode_marks_cuts_before_untracked_values_invalid():
    class ViaNumpy(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            self.c = nn.Linear(4, 4)

        def forward(self, x):
            y = self.a(x)
            y = torch.from_numpy(y.numpy().copy())  # provenance lost outside torch
            return self.c(self.b(y))

    model = ViaNumpy().eval()
    x = torch.randn(2, 4)
    sm = SplitModel.build(model, x, mode="hooks")
    assert sm.valid_splits() == [0, 2, 3]
    _check_all(sm, model, x)


def test_graph_module_fallback_builds_the_same_cuts(resnet18):
    model, x = resnet18
    sm = SplitModel.build(model, x)
    sm.engine._lines = None  # as if fx's code could not be cut per node
    sm.engine._cache.clear()
    _check_all(sm, model, x)
    k = sm.n // 3
    crossing, edge = sm.run_prefix(k, x, timed=True)
    _, cloud = sm.run_suffix(k, crossing, timed=True)
    assert [i for i, _ in edge + cloud] == list(range(1, sm.n + 1))


def test_hooks_mode_handles_units_that_return_their_input():
    class PassThrough(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.drop = nn.Dropout(0.5)  # eval: returns the very same tensor
            self.b = nn.Linear(4, 4)

        def forward(self, x):
            y = self.a(x)
            z = self.drop(y)
            return self.b(z) + y

    model = PassThrough().eval()
    x = torch.randn(2, 4)
    sm = SplitModel.build(model, x, mode="hooks")
    assert sm.valid_splits() == [0, 1, 2, 3]
    _check_all(sm, model, x)
