"""Middle segments of a split model: pipeline stages a+1..b chain back to the whole model."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from experiment_design.errors import TracrError
from experiment_design.models import create_model, get_model_spec, list_models
from experiment_design.split import SplitModel, build_split_model, max_abs_diff

# the large models' every-cut checks take 10-20 s each on 2 cores: make test-all runs them
HEAVY = {"efficientnet_b0", "fasterrcnn-backbone", "resnet50", "vgg16"}
MODELS = [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in list_models()]

TOL = 1e-5
#: A model with more stages (valid (a, b) pairs) than this is checked on 8 of them,
#: drawn with a fixed seed: n^2 segments of a model of many layers take too long for
#: a unit test. Today every stage is checked for alexnet in graph mode (276) and for
#: every registered model in hooks mode but yolov8n (300, at some 25 ms each).
MAX_PAIRS = 280


def _pairs(sm: SplitModel) -> list[tuple[int, int]]:
    """Every stage (a, b) with a <= b between valid cuts."""
    valid = sm.valid_splits()
    return [(a, b) for a in valid for b in valid if a <= b]


def _sample(pairs: list[tuple[int, int]], size: int, seed: int = 0) -> list[tuple[int, int]]:
    """``size`` of ``pairs`` (all if fewer), drawn with a fixed seed, in order."""
    return sorted(random.Random(seed).sample(pairs, min(size, len(pairs))))


@pytest.fixture(scope="module")
def registry():
    """A registered model at its smallest input, with its output; the last one is kept
    for the next test (only one: together the registry's models hold about 1 GB)."""
    cache: dict[str, tuple[nn.Module, torch.Tensor, object]] = {}

    def get(name: str):
        if name not in cache:
            cache.clear()
            torch.set_num_threads(1)
            spec = get_model_spec(name)
            shape = spec.min_input_shape or spec.input_shape
            x = torch.randn((1, *shape), generator=torch.Generator().manual_seed(0))
            model = create_model(name, seed=0)
            with torch.no_grad():
                cache[name] = (model, x, model(x))
        return cache[name]

    return get


def _in_mode(sm: SplitModel, mode: str) -> SplitModel:
    """``sm`` itself, or its model rebuilt in ``mode``."""
    return sm if sm.mode == mode else SplitModel.build(sm.model, sm.example, mode=mode)


@pytest.fixture(scope="module")
def resnet18():
    torch.set_num_threads(1)
    return build_split_model("resnet18", input_shape=get_model_spec("resnet18").min_input_shape)


def _same(a, b) -> bool:
    """Bit for bit for tensors; the same type and value for plain data (sizes, ints)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("mode", ["graph", "hooks"])
@pytest.mark.parametrize("name", MODELS)
def test_every_stage_chain_reproduces_the_model(registry, name, mode):
    """prefix(a) -> segment(a, b) -> suffix(b) == model(x) for every stage (a, b).

    Checked as: segment(a, b) hands on exactly (bit for bit) the tensors prefix(b)
    computes, and suffix(b) turns those into the model output. Running suffix(b)
    once per b rather than once per pair keeps the n^2 pairs affordable.
    """
    model, x, ref = registry(name)
    try:
        sm = SplitModel.build(model, x, mode=mode)
    except TracrError:
        pytest.skip(f"{name} has no {mode} mode")
    pairs = _pairs(sm)
    if len(pairs) > MAX_PAIRS:
        pairs = _sample(pairs, 8)
    prefixes = {k: sm.run_prefix(k, x)[0] for pair in pairs for k in pair}
    differ = []
    for a, b in pairs:
        crossing, _ = sm.run_segment(a, b, prefixes[a])
        assert list(crossing) == list(sm.points[b].crossing), (a, b)
        if not all(_same(crossing[k], v) for k, v in prefixes[b].items()):
            differ.append((a, b))
    assert not differ, f"{name} ({mode}): segments differ from the prefix at {differ}"
    bad = {}
    for b in {b for _, b in pairs}:
        d = max_abs_diff(sm.run_suffix(b, prefixes[b])[0], ref)
        if not d <= TOL:
            bad[b] = d
    assert not bad, f"{name} ({mode}): suffix output differs at {bad}"


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "torchvision:googlenet"])
def test_three_stage_pipelines_on_torchvision_models(name):
    torch.set_num_threads(1)
    sm = build_split_model(name, input_shape=(3, 64, 64))
    assert sm.mode == "graph"
    x = sm.example
    with torch.no_grad():
        ref = sm.model(x)
    pairs = _sample([(a, b) for a, b in _pairs(sm) if 0 < a < b < sm.n], 15, seed=1)
    assert len(pairs) == 15
    for a, b in pairs:
        first, _ = sm.run_stage(0, a, x)
        prefix, _ = sm.run_prefix(a, x)
        assert list(first) == list(prefix)
        assert all(torch.equal(first[k], prefix[k]) for k in prefix)
        middle, _ = sm.run_stage(a, b, first)
        out, _ = sm.run_stage(b, sm.n, middle)
        assert max_abs_diff(out, ref) <= TOL, (a, b)


def test_long_skip_tensors_are_passed_through_untouched(resnet18):
    sm = resnet18
    # a and b inside one residual block: the block's input skips past both
    inside = [(a, b) for a, b in _pairs(sm) if a < b and sm.passthrough(a, b)]
    assert inside
    a, b = inside[0]
    crossing, _ = sm.run_prefix(a, sm.example)
    out, _ = sm.run_segment(a, b, crossing)
    skip = sm.passthrough(a, b)
    assert set(skip) < set(out) and set(skip) <= set(crossing)
    assert all(out[name] is crossing[name] for name in skip)
    assert all(out[name] is not crossing.get(name) for name in set(out) - set(skip))
    assert sm.passthrough(0, sm.n) == ()
    assert sm.passthrough(a, a) == sm.points[a].crossing


@pytest.mark.skipif("yolov8n" not in list_models(), reason="ultralytics not installed")
def test_hooks_segments_pass_long_skips_through(registry):
    model, x, _ = registry("yolov8n")
    sm = SplitModel.build(model, x, mode="hooks")
    a, b = next((a, b) for a, b in _pairs(sm) if a < b and sm.passthrough(a, b))
    crossing, _ = sm.run_prefix(a, x)
    out, _ = sm.run_segment(a, b, crossing)
    assert all(out[name] is crossing[name] for name in sm.passthrough(a, b))


@pytest.mark.parametrize("mode", ["graph", "hooks"])
def test_segment_from_cut_zero_is_the_prefix_and_a_empty_stage_forwards(resnet18, mode):
    sm = _in_mode(resnet18, mode)
    x = sm.example
    assert sm.points[0].crossing == (sm.input_name,)
    for b in sm.valid_splits()[:: max(1, sm.n // 8)]:
        seg, _ = sm.run_segment(0, b, {sm.input_name: x})
        pre, _ = sm.run_prefix(b, x)
        assert list(seg) == list(pre)
        assert all(torch.equal(seg[k], pre[k]) for k in pre)
        same, times = sm.run_segment(b, b, pre, timed=True)
        assert times == [] and all(same[k] is pre[k] for k in pre)
    out, _ = sm.run_stage(0, sm.n, x)
    with torch.no_grad():
        assert max_abs_diff(out, sm.model(x)) <= TOL


@pytest.mark.parametrize("mode", ["graph", "hooks"])
def test_timed_stages_time_each_of_their_layers_once(resnet18, mode):
    sm = _in_mode(resnet18, mode)
    x = sm.example
    a, b = sm.n // 3, 2 * sm.n // 3
    first, t1 = sm.run_stage(0, a, x, timed=True)
    middle, t2 = sm.run_stage(a, b, first, timed=True)
    out, t3 = sm.run_stage(b, sm.n, middle, timed=True)
    assert [i for i, _ in t2] == list(range(a + 1, b + 1))
    assert [i for i, _ in t1 + t2 + t3] == list(range(1, sm.n + 1))
    assert all(ms >= 0 for _, ms in t1 + t2 + t3)
    with torch.no_grad():
        assert max_abs_diff(out, sm.model(x)) <= TOL


def test_prepare_segments_builds_every_stage_before_the_first_inference(resnet18, monkeypatch):
    sm = SplitModel.build(resnet18.model, resnet18.example)
    x, n = sm.example, sm.n
    stages = [(0, 10), (10, 40), (40, n)]
    # one segment per stage, and the suffix the last stage runs
    assert sm.prepare_segments(stages) == 4
    at10, at40 = sm.run_prefix(10, x)[0], sm.run_prefix(40, x)[0]
    built: list[tuple[object, str]] = []
    compile_ = sm.engine._compile
    monkeypatch.setattr(
        sm.engine,
        "_compile",
        lambda k, side, clock: built.append((k, side)) or compile_(k, side, clock),
    )
    crossing = x
    for a, b in stages:  # nothing is generated inside the timing
        crossing, _ = sm.run_stage(a, b, crossing, timed=True)
    sm.run_segment(40, n, at40, timed=True)
    assert built == []
    sm.run_segment(10, 20, at10, timed=True)  # not prepared: built on first use
    assert built == [((10, 20), "segment")]
    assert SplitModel.build(resnet18.model, x, mode="hooks").prepare_segments([(0, 3)]) == 0


def test_graph_module_fallback_builds_the_same_segments(resnet18):
    sm = SplitModel.build(resnet18.model, resnet18.example)
    sm.engine._lines = None  # as if fx's code could not be cut per node
    x = sm.example
    with torch.no_grad():
        ref = sm.model(x)
    for a, b in _sample(_pairs(sm), 8, seed=2):
        crossing, _ = sm.run_segment(a, b, sm.run_prefix(a, x)[0])
        assert list(crossing) == list(sm.points[b].crossing)
        out, _ = sm.run_suffix(b, crossing)
        assert max_abs_diff(out, ref) <= TOL, (a, b)
    a, b = next((a, b) for a, b in _pairs(sm) if b == a + 3 and sm.passthrough(a, b))
    crossing = sm.run_prefix(a, x)[0]
    out, times = sm.run_segment(a, b, crossing, timed=True)
    assert [i for i, _ in times] == [a + 1, a + 2, a + 3]
    assert all(out[name] is crossing[name] for name in sm.passthrough(a, b))


class _Box:
    """Neither a tensor nor plain data: it cannot cross a cut."""

    def __init__(self, n: int) -> None:
        self.n = n


@torch.fx.wrap
def _box(n: int) -> _Box:
    return _Box(n)


@torch.fx.wrap
def _unbox(box: _Box) -> int:
    return box.n


class _SizeUser(nn.Module):
    """Keeps the batch size in a box: the cuts that would send the box are invalid."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        b = _box(x.size(0))
        y = self.conv(x)
        return y.view(_unbox(b), -1)


def test_bad_stages_are_user_errors(resnet18):
    sm = resnet18
    x, n = sm.example, sm.n
    crossing, _ = sm.run_prefix(5, x)
    with pytest.raises(TracrError, match="runs backwards"):
        sm.run_segment(5, 3, crossing)
    with pytest.raises(TracrError, match="out of range"):
        sm.run_segment(5, n + 1, crossing)
    with pytest.raises(TracrError, match="out of range"):
        sm.run_stage(-1, 3, x)
    with pytest.raises(TracrError, match="out of range"):
        sm.passthrough(0, n + 1)
    with pytest.raises(TracrError, match="out of range"):
        sm.prepare_segments([(0, n + 1)])
    with pytest.raises(TracrError, match="runs backwards"):
        sm.prepare_segments([(4, 2)])
    with pytest.raises(TracrError, match="crossing tensors missing"):
        sm.run_segment(5, 9, {})
    some = dict(list(crossing.items())[:-1])
    with pytest.raises(TracrError, match="crossing tensors missing"):
        sm.run_stage(5, n, some)
    with pytest.raises(TracrError, match="only the first stage"):
        sm.run_stage(5, 9, x)

    small = SplitModel.build(_SizeUser().eval(), torch.randn(2, 3, 8, 8))
    bad = next(p.index for p in small.points if not p.valid)
    with pytest.raises(TracrError, match="not a valid cut"):
        small.run_segment(0, bad, {small.input_name: small.example})
    with pytest.raises(TracrError, match="not a valid cut"):
        small.passthrough(bad, small.n)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["graph", "hooks"])
def test_cuda_timed_pipeline_matches(mode):
    sm = build_split_model("resnet18", input_shape=(3, 32, 32), mode=mode).to("cuda")
    x = sm.example
    a, b = sm.n // 3, 2 * sm.n // 3
    sm.prepare_segments([(0, a), (a, b), (b, sm.n)])
    first, t1 = sm.run_stage(0, a, x, timed=True)
    middle, t2 = sm.run_stage(a, b, first, timed=True)
    out, t3 = sm.run_stage(b, sm.n, middle, timed=True)
    assert [i for i, _ in t1 + t2 + t3] == list(range(1, sm.n + 1))
    with torch.no_grad():
        assert max_abs_diff(out, sm.model(x)) <= 1e-3  # cuDNN picks other kernels per call
