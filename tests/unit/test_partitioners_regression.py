"""Per-layer-class regressions: class mapping, Eq. 1-2, fallbacks, plain-number models."""

from __future__ import annotations

import json
import random

import pytest

from experiment_design.errors import TracrError
from experiment_design.partitioners import regression as R


@pytest.mark.parametrize(
    "type_name, cls",
    [
        ("Conv2d", "conv"),
        ("conv2d", "conv"),
        ("torch.nn.modules.conv.Conv2d", "conv"),
        ("ConvTranspose2d", "conv"),
        ("BasicBlock", "conv"),
        ("InvertedResidual", "conv"),
        ("Conv2dNormActivation", "conv"),
        ("Linear", "linear"),
        ("linear", "linear"),
        ("addmm", "linear"),
        ("matmul", "linear"),
        ("MaxPool2d", "pooling"),
        ("AdaptiveAvgPool2d", "pooling"),
        ("adaptive_avg_pool2d", "pooling"),
        ("ReLU", "activation"),
        ("relu", "activation"),
        ("ReLU6", "activation"),
        ("Hardswish", "activation"),
        ("SiLU", "activation"),
        ("softmax", "activation"),
        ("BatchNorm2d", "norm"),
        ("LayerNorm", "norm"),
        ("batch_norm", "norm"),
        ("LocalResponseNorm", "norm"),
        ("add", "other"),
        ("flatten", "other"),
        ("Dropout", "other"),
        ("cat", "other"),
        ("Identity", "other"),
    ],
)
def test_layer_class_maps_module_and_function_types(type_name, cls):
    assert R.layer_class(type_name) == cls


def test_type_map_overrides_and_rejects_unknown_class():
    assert R.layer_class("MyAttention", {"MyAttention": "linear"}) == "linear"
    with pytest.raises(TracrError):
        R.layer_class("MyAttention", {"MyAttention": "attention"})


def test_layer_bytes_is_param_bytes_else_input_bytes():
    assert R.layer_bytes({"param_bytes": 400, "input_bytes": 9}) == 400
    assert R.layer_bytes({"param_bytes": 0, "input_bytes": 9}) == 9
    assert R.layer_bytes({"params": 0, "input_bytes": 12}) == 12


def test_fit_line_recovers_known_coefficients():
    xs = [1e3, 5e4, 2e5, 1e6, 3e6]
    line = R.fit_line(xs, [2.5e-6 * x + 0.4 for x in xs])
    assert line["model"] == "linear"
    assert line["a"] == pytest.approx(2.5e-6, rel=1e-9)
    assert line["b"] == pytest.approx(0.4, rel=1e-9)
    assert line["r2"] == pytest.approx(1.0)


def test_fit_line_falls_back_to_ratio_and_constant():
    one = R.fit_line([2000], [3.0])
    assert one["model"] == "ratio" and one["b"] == 0.0
    assert one["a"] * 2000 == pytest.approx(3.0)
    same_x = R.fit_line([10, 10], [1.0, 3.0])
    assert same_x["model"] == "ratio" and same_x["a"] * 10 == pytest.approx(2.0)
    const = R.fit_line([0, 0], [1.0, 2.0])
    assert const["model"] == "constant" and const["b"] == pytest.approx(1.5)


def test_fit_line_without_sklearn_gives_the_same_line(monkeypatch):
    xs = [1.0, 2.0, 4.0, 8.0]
    ys = [0.3 * x + 1.0 + (0.01 if i % 2 else -0.01) for i, x in enumerate(xs)]
    with_sk = R.fit_line(xs, ys)
    monkeypatch.setattr(R, "_sklearn_linear", lambda positive=False: None)
    plain = R.fit_line(xs, ys)
    assert plain["fit"] == "ols" and with_sk["fit"].startswith("sklearn")
    assert plain["a"] == pytest.approx(with_sk["a"]) and plain["b"] == pytest.approx(with_sk["b"])


def _rows(spec):
    """spec: [(type, param_bytes, input_bytes)] -> profile rows."""
    return [
        {
            "index": i + 1,
            "name": f"l{i + 1}",
            "type": t,
            "params": pb // 4,
            "param_bytes": pb,
            "input_bytes": ib,
            "output_bytes": ib,
            "flops": None,
        }
        for i, (t, pb, ib) in enumerate(spec)
    ]


def test_fit_bytes_models_recovers_per_class_coefficients_from_synthetic_timings():
    truth = {
        "conv": (3e-6, 0.2),
        "linear": (1e-6, 0.05),
        "pooling": (4e-7, 0.01),
        "activation": (1e-7, 0.0),
    }
    rng = random.Random(0)
    spec = []
    for _ in range(4):
        spec.append(("Conv2d", rng.randrange(10_000, 5_000_000, 4), 600_000))
        spec.append(("Linear", rng.randrange(10_000, 50_000_000, 4), 36_864))
        spec.append(("MaxPool2d", 0, rng.randrange(10_000, 800_000, 4)))
        spec.append(("ReLU", 0, rng.randrange(10_000, 800_000, 4)))
    rows = _rows(spec)
    ms = [
        truth[R.layer_class(r["type"])][0] * R.layer_bytes(r) + truth[R.layer_class(r["type"])][1]
        for r in rows
    ]
    models = R.fit_bytes_models(rows, ms)
    for cls, (a, b) in truth.items():
        got = models["classes"][cls]
        assert got["model"] == "linear" and got["n"] == 4
        assert got["a"] == pytest.approx(a, rel=1e-6)
        assert got["b"] == pytest.approx(b, abs=1e-6)
    # plain numbers only: survives JSON and check_models unchanged
    shipped = R.check_models(json.loads(json.dumps(models)))
    for row, t in zip(rows, ms, strict=True):
        assert R.predict_bytes(shipped, row) == pytest.approx(t, rel=1e-6, abs=1e-9)


def test_untimed_layers_are_skipped_and_unseen_class_uses_the_all_line():
    rows = _rows([("Conv2d", 4000, 10), ("Conv2d", 8000, 10), ("ReLU", 0, 100)])
    models = R.fit_bytes_models(rows, [1.0, 2.0, None])
    assert set(models["classes"]) == {"conv"}
    assert R.predict_bytes(models, {"type": "ReLU", "param_bytes": 0, "input_bytes": 4000}) >= 0


def test_profile_length_mismatch_is_a_user_error():
    with pytest.raises(TracrError):
        R.fit_bytes_models(_rows([("Conv2d", 4, 4)]), [1.0, 2.0])


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"classes": {"conv": {"a": "x", "b": 0}}, "all": {"a": 0, "b": 0}},
        {"classes": {"evil": {"a": 1, "b": 0}}, "all": {"a": 0, "b": 0}},
    ],
)
def test_check_models_rejects_malformed_input(bad):
    with pytest.raises(TracrError):
        R.check_models(bad)


def test_fit_feature_models_recovers_non_negative_weights():
    rng = random.Random(1)
    rows = []
    for i in range(12):
        rows.append(
            {
                "index": i + 1,
                "type": "Conv2d",
                "flops": rng.randrange(10**6, 10**9),
                "input_bytes": rng.randrange(10**4, 10**6),
                "output_bytes": rng.randrange(10**4, 10**6),
                "params": rng.randrange(10**3, 10**6),
            }
        )
    w = {"flops": 2e-9, "input_bytes": 0.0, "output_bytes": 5e-7, "params": 0.0}
    ms = [sum(w[f] * r[f] for f in R.FEATURES) + 0.3 for r in rows]
    models = R.fit_feature_models(rows, ms)
    got = models["classes"]["conv"]
    assert all(v >= 0 for v in got["weights"].values())
    for row, t in zip(rows, ms, strict=True):
        assert R.predict_features(models, row) == pytest.approx(t, rel=1e-3)
    assert got["weights"]["flops"] == pytest.approx(2e-9, rel=1e-3)
    assert got["weights"]["output_bytes"] == pytest.approx(5e-7, rel=1e-3)


def test_fit_feature_models_without_sklearn_stays_non_negative(monkeypatch):
    monkeypatch.setattr(R, "_sklearn_linear", lambda positive=False: None)
    rows = [
        {
            "index": i,
            "type": "Linear",
            "flops": 10 * i,
            "input_bytes": 5 + i,
            "output_bytes": 1,
            "params": 100 - i,
        }
        for i in range(1, 8)
    ]
    ms = [0.1 * r["flops"] + 0.5 for r in rows]
    models = R.fit_feature_models(rows, ms)
    got = models["classes"]["linear"]
    assert got["fit"].startswith("numpy")
    assert all(v >= 0 for v in got["weights"].values())
    for row, t in zip(rows, ms, strict=True):
        assert R.predict_features(models, row) == pytest.approx(t, rel=1e-6)
