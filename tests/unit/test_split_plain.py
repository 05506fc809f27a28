"""Cuts that sizes, ints and None cross (models that compute shapes) are valid, and the
split run through a real data channel equals the unsplit model exactly."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn

from experiment_design.split import SplitModel, build_split_model
from experiment_design.split.outputs import crosses, crossing_nbytes, leaves, rebuild
from experiment_design.transport.plain import plain_nbytes
from tests.unit.test_transport_plain import channel_pair, same


def _plain_cuts(sm: SplitModel) -> list[int]:
    """Cuts of a graph-mode model where some crossing value is not a tensor (from one
    pass that records every node's value, not one split run per cut)."""
    values = {}

    class Record(fx.Interpreter):
        def run_node(self, n):
            values[n.name] = out = super().run_node(n)
            return out

    with torch.no_grad():
        Record(sm.engine.gm).run(sm.example)
    flat = {name: v for node, out in values.items() for name, v in leaves(node, out)}
    return [
        k
        for k in sm.valid_splits()
        if any(not isinstance(flat[name], torch.Tensor) for name in sm.points[k].crossing)
    ]


def _sample(ks: list[int], n: int) -> list[int]:
    step = max(1, len(ks) // n)
    return sorted({*ks[::step][:n], ks[-1]})


def _split_over_the_wire(sm: SplitModel, k: int, x: torch.Tensor):
    crossing, _ = sm.run_prefix(k, x)
    with channel_pair() as (edge, cloud):
        edge.send({"split": k}, crossing)
        _, received, _ = cloud.recv()
    assert set(received) == set(crossing)
    for name, v in crossing.items():
        assert same(received[name], v), name
    out, _ = sm.run_suffix(k, received)
    return out


@pytest.mark.parametrize(
    "name,shape",
    [("torchvision:shufflenet_v2_x1_0", (3, 64, 64)),
     pytest.param("torchvision:vit_b_16", None, marks=pytest.mark.slow)],
    ids=["shufflenet_v2_x1_0", "vit_b_16"],
)
def test_every_cut_of_a_shape_computing_model_is_valid_and_exact_over_a_channel(name, shape):
    # Regression: cuts across x.size(), x.shape[0] // 2, an assert's None or a
    # (tensor, None) from attention were invalid (shufflenet 198 of 368 valid, vit 155/233).
    sm = build_split_model(name, input_shape=shape)
    assert sm.valid_splits() == list(range(sm.n + 1))
    plain = _plain_cuts(sm)
    assert len(plain) > 20
    x = torch.randn(sm.example.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = sm.model(x)
    for k in _sample(plain, 4):
        assert torch.equal(_split_over_the_wire(sm, k, x), ref), k


def test_a_pipeline_stage_hands_plain_values_on_over_two_channels():
    sm = build_split_model("torchvision:shufflenet_v2_x1_0", input_shape=(3, 64, 64))
    plain = _plain_cuts(sm)
    a, b = plain[2], plain[len(plain) // 2]
    x = sm.example
    crossing, _ = sm.run_stage(0, a, x)
    with channel_pair() as (s1, s2), channel_pair() as (s2_out, s3):
        s1.send({}, crossing)
        _, got, _ = s2.recv()
        mid, _ = sm.run_stage(a, b, got)
        s2_out.send({}, mid)
        _, got2, _ = s3.recv()
    out, _ = sm.run_stage(b, sm.n, got2)
    with torch.no_grad():
        assert torch.equal(out, sm.model(x))


@pytest.mark.parametrize("name", ["resnet18", "alexnet"])
def test_all_tensor_models_are_unchanged(name):
    sm = build_split_model(name, input_shape=(3, 64, 64))
    assert sm.valid_splits() == list(range(sm.n + 1))
    assert not _plain_cuts(sm)
    k = sm.n // 2
    crossing, _ = sm.run_prefix(k, sm.example)
    assert sm.points[k].crossing_bytes == sum(
        t.numel() * t.element_size() for t in crossing.values()
    )


def test_crossing_bytes_count_plain_values_as_their_encoded_size():
    sm = build_split_model("torchvision:shufflenet_v2_x1_0", input_shape=(3, 64, 64))
    for k in _plain_cuts(sm)[:5]:
        crossing, _ = sm.run_prefix(k, sm.example)
        want = sum(
            v.numel() * v.element_size() if isinstance(v, torch.Tensor) else plain_nbytes(v)
            for v in crossing.values()
        )
        assert sm.points[k].crossing_bytes == want


class _Attend(nn.Module):
    """Units whose outputs are a (tensor, None) pair and a size, as attention and
    reshaping code make them."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.size = _SizeOf()
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        b, n = self.size(a)
        return self.head(a.reshape(b, n, -1).mean(1))


class _SizeOf(nn.Module):
    def forward(self, t: torch.Tensor) -> tuple[int, int]:
        return t.shape[0], t.shape[1]


@pytest.mark.parametrize("mode", ["graph", "hooks"])
def test_both_engines_cross_tuples_with_none_and_sizes(mode):
    torch.manual_seed(0)
    sm = SplitModel.build(_Attend(), torch.randn(2, 5, 8), mode=mode)
    assert sm.valid_splits() == list(range(sm.n + 1))
    with torch.no_grad():  # attention takes another kernel when autograd records
        ref = sm.model(sm.example)
    for k in range(sm.n + 1):
        assert torch.equal(_split_over_the_wire(sm, k, sm.example), ref), (mode, k)


def test_a_value_that_is_neither_makes_its_cuts_invalid():
    class Opaque(nn.Module):
        def forward(self, x):
            return x, object()

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = Opaque()
            self.b = nn.ReLU()

        def forward(self, x):
            y, o = self.a(x)
            return self.b(y) if o is not None else y

    sm = SplitModel.build(M(), torch.randn(1, 3), mode="hooks")
    assert not sm.points[1].valid
    with pytest.raises(Exception, match="neither a tensor nor plain data"):
        sm.run_prefix(1, sm.example)


def test_leaves_and_rebuild_are_inverse_and_keep_plain_parts_whole():
    t = torch.ones(2)
    v = (t, None, [t * 2, {"k": 3}], torch.Size([1, 2]))
    named = leaves("n", v)
    assert [name for name, _ in named] == ["n[0]", "n[1]", "n[2][0]", "n[2][1]", "n[3]"]
    assert named[3][1] == {"k": 3} and named[4][1] == torch.Size([1, 2])
    assert same(rebuild("n", v, dict(named)), v)
    assert crosses(v) and not crosses((t, object()))
    assert crossing_nbytes(v) == 8 + 8 + plain_nbytes(None) + plain_nbytes({"k": 3}) + (
        plain_nbytes(torch.Size([1, 2]))
    )
