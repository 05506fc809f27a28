"""The central check: every registered model, every valid cut, split output == model output.

Parametrized over the registry itself, so a newly registered model is covered
without anyone writing a test for it.
"""

from __future__ import annotations

import pytest
import torch

from experiment_design.models import create_model, get_model_spec, list_models
from experiment_design.split import SplitModel, max_abs_diff
from experiment_design.transport.plain import is_plain

# the large models' every-cut checks take 10-20 s each on 2 cores: make test-all runs them
HEAVY = {"efficientnet_b0", "fasterrcnn-backbone", "resnet50", "vgg16"}
MODELS = [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in list_models()]

TOL = 1e-5


@pytest.fixture(scope="module")
def built():
    """One SplitModel per model name, built once for the module."""
    cache: dict[str, tuple[SplitModel, torch.Tensor, object]] = {}

    def get(name: str):
        if name not in cache:
            torch.set_num_threads(1)
            spec = get_model_spec(name)
            shape = spec.min_input_shape or spec.input_shape
            x = torch.randn((1, *shape), generator=torch.Generator().manual_seed(0))
            model = create_model(name, seed=0)
            sm = SplitModel.build(model, x)
            with torch.no_grad():
                ref = model(x)
            cache[name] = (sm, x, ref)
        return cache[name]

    return get


@pytest.mark.parametrize("name", MODELS)
def test_every_split_reproduces_the_model(built, name):
    sm, x, ref = built(name)
    assert len(sm.points) == sm.n + 1
    assert [p.index for p in sm.points] == list(range(sm.n + 1))
    valid = sm.valid_splits()
    assert 0 in valid and sm.n in valid
    bad = {}
    for k in valid:
        crossing, _ = sm.run_prefix(k, x)
        assert list(crossing) == list(sm.points[k].crossing)
        # tensors, or plain data (sizes, ints, None) crossing beside them
        assert all(isinstance(t, torch.Tensor) or is_plain(t) for t in crossing.values())
        out, _ = sm.run_suffix(k, crossing)
        d = max_abs_diff(out, ref)
        if not d <= TOL:
            bad[k] = d
    assert not bad, f"{name} ({sm.mode}): split output differs at {bad}"


@pytest.mark.parametrize("name", MODELS)
def test_profile_is_plain_json(built, name):
    import json

    sm, _, _ = built(name)
    rows = sm.profile()
    assert len(rows) == sm.n
    json.dumps(rows)
    assert sm.points[-1].cum_params == sum(p.numel() for p in sm.model.parameters())
    for row in rows:
        assert row["param_bytes"] == 4 * row["params"]  # float32: Eq. 2
        assert row["flops"] is None or row["flops"] >= 0
