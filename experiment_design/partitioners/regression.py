"""Per-layer-type latency regressions, as plain numbers.

Two model families live here:

* the paper's Eq. 1-2 model (``fit_bytes_models``): one line ``t = a * m + b``
  per layer class, where ``m`` is the layer's parameter bytes (precision x
  element count, Eq. 2) or, for a layer without parameters, its input bytes;
* a richer model (``fit_feature_models``) on FLOPs, input bytes, output bytes
  and parameter count with non-negative coefficients, used by
  ``predicted-argmin`` to generalize to layers that were not profiled.

Every fitted model is a plain JSON-able dict of floats, so a cloud participant
can ship its models to the edge without pickling anything. scikit-learn's
``LinearRegression`` does the fit when it is installed; on a device with only
torch and numpy the same least-squares fit is done with numpy, and the dict
says which one ran.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence

from experiment_design.errors import TracrError

log = logging.getLogger(__name__)

LAYER_CLASSES = ("conv", "linear", "pooling", "activation", "norm", "other")
FEATURES = ("flops", "input_bytes", "output_bytes", "params")

# Checked in order; the first class whose keyword occurs in the lower-cased
# type name wins. Composite blocks (ResNet's BasicBlock, MobileNet's
# InvertedResidual) are dominated by their convolutions, so they count as conv.
_KEYWORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "norm",
        (
            "batchnorm",
            "batch_norm",
            "layernorm",
            "layer_norm",
            "groupnorm",
            "group_norm",
            "instancenorm",
            "instance_norm",
            "localresponsenorm",
            "local_response_norm",
        ),
    ),
    ("conv", ("conv", "block", "bottleneck", "residual", "c2f", "sppf")),
    ("pooling", ("pool",)),
    ("linear", ("linear", "addmm", "matmul", "bmm", "einsum")),
    (
        "activation",
        (
            "relu",
            "gelu",
            "silu",
            "sigmoid",
            "tanh",
            "hardswish",
            "hardsigmoid",
            "elu",
            "softmax",
            "mish",
            "softplus",
            "hardtanh",
            "swish",
            "glu",
        ),
    ),
)


def layer_class(type_name: str, type_map: Mapping[str, str] | None = None) -> str:
    """The regression class (one of ``LAYER_CLASSES``) of a layer type name.

    ``type_name`` is what the split engine records: a module class name
    (``Conv2d``), a qualified one, or a function name (``relu``, ``add``).
    ``type_map`` overrides the built-in mapping for exact type names.

    >>> layer_class("Conv2d"), layer_class("adaptive_avg_pool2d"), layer_class("add")
    ('conv', 'pooling', 'other')
    """
    if type_map and type_name in type_map:
        cls = type_map[type_name]
        if cls not in LAYER_CLASSES:
            raise TracrError(
                f"type_map maps '{type_name}' to unknown layer class '{cls}'.",
                hint=f"Use one of {list(LAYER_CLASSES)}.",
            )
        return cls
    low = str(type_name).lower()
    if low.startswith("matmul") or low in ("mm", "linear"):
        return "linear"
    for cls, words in _KEYWORDS:
        if any(w in low for w in words):
            return cls
    return "other"


def layer_bytes(row: Mapping) -> int:
    """Eq. 2's ``m_j`` for one profile row.

    The parameter bytes (precision x element count, summed over parameters);
    a layer without parameters uses its input bytes instead, so pooling and
    activations still get a size that tracks their work.
    """
    pb = int(row.get("param_bytes") or 0)
    return pb if pb > 0 else int(row.get("input_bytes") or 0)


def _sklearn_linear(positive: bool = False):
    try:
        from sklearn.linear_model import LinearRegression
    except ImportError:
        return None
    return LinearRegression(positive=positive)


def _r2(ys: Sequence[float], preds: Sequence[float]) -> float | None:
    if len(ys) < 2:
        return None
    mean = sum(ys) / len(ys)
    ss_tot = sum((y - mean) ** 2 for y in ys)
    if ss_tot == 0:
        return None
    ss_res = sum((y - p) ** 2 for y, p in zip(ys, preds, strict=True))
    return 1.0 - ss_res / ss_tot


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> dict:
    """Fit Eq. 1, ``t = a * m + b``, to samples; returns ``{"a", "b", "model", "n", "r2", "fit"}``.

    Falls back when a line is not identifiable: one sample, or all samples at
    the same ``m``, gives a ratio model ``t = a * m`` through the origin
    (``model: "ratio"``); ``m == 0`` everywhere gives a constant (``"constant"``).
    """
    xs = [float(x) for x in xs]
    ys = [float(y) for y in ys]
    n = len(xs)
    if n == 0:
        raise ValueError("fit_line needs at least one sample")
    mean_x = sum(xs) / n
    mean_y = sum(ys) / n
    if all(x == xs[0] for x in xs):
        if mean_x > 0:
            out = {"a": mean_y / mean_x, "b": 0.0, "model": "ratio"}
        else:
            out = {"a": 0.0, "b": mean_y, "model": "constant"}
        out.update(n=n, r2=None, fit="ratio" if mean_x > 0 else "mean")
        return out
    reg = _sklearn_linear()
    if reg is not None:
        import numpy as np

        reg.fit(np.asarray(xs).reshape(-1, 1), np.asarray(ys))
        a, b, fit = float(reg.coef_[0]), float(reg.intercept_), "sklearn.LinearRegression"
    else:
        sxx = sum((x - mean_x) ** 2 for x in xs)
        sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
        a = sxy / sxx
        b = mean_y - a * mean_x
        fit = "ols"
    r2 = _r2(ys, [a * x + b for x in xs])
    return {"a": a, "b": b, "model": "linear", "n": n, "r2": r2, "fit": fit}


def _samples(
    layers: Sequence[Mapping], layer_ms: Sequence[float | None], type_map: Mapping | None
) -> dict[str, list[tuple[Mapping, float]]]:
    if len(layer_ms) != len(layers):
        raise TracrError(
            f"The profile has {len(layer_ms)} layer times for a model of {len(layers)} layers.",
            hint="Profile and split model must come from the same model, depth and mode.",
        )
    by_class: dict[str, list[tuple[Mapping, float]]] = {}
    for row, ms in zip(layers, layer_ms, strict=True):
        if ms is None or not math.isfinite(float(ms)):
            continue
        by_class.setdefault(layer_class(row["type"], type_map), []).append((row, float(ms)))
    if not by_class:
        raise TracrError("The profile has no layer times to fit a regression to.")
    return by_class


def fit_bytes_models(
    layers: Sequence[Mapping],
    layer_ms: Sequence[float | None],
    *,
    type_map: Mapping[str, str] | None = None,
) -> dict:
    """The paper's per-layer-class Eq. 1 models from one device's profile.

    ``layers`` are ``SplitModel.profile()`` rows, ``layer_ms`` the device's
    measured time of each layer (same order; ``None`` for a layer not timed).
    Returns plain JSON: ``{"feature": "m_bytes", "classes": {cls: {a, b, model,
    n, r2, fit}}, "all": {...}}``; ``all`` is a line over every sample, used
    for a class the device never profiled.
    """
    by_class = _samples(layers, layer_ms, type_map)
    classes = {}
    for cls, samples in sorted(by_class.items()):
        classes[cls] = fit_line([layer_bytes(r) for r, _ in samples], [ms for _, ms in samples])
    every = [s for samples in by_class.values() for s in samples]
    return {
        "feature": "m_bytes",
        "classes": classes,
        "all": fit_line([layer_bytes(r) for r, _ in every], [ms for _, ms in every]),
        "type_map": dict(type_map or {}),
    }


def check_models(models: Mapping) -> dict:
    """Validate a models dict received as JSON (e.g. the cloud's) and return a clean copy.

    Only the numbers and names this module writes are accepted, so a peer
    can never hand the edge anything but floats.
    """

    def line(d: Mapping, where: str) -> dict:
        try:
            out = {
                "a": float(d["a"]),
                "b": float(d["b"]),
                "model": str(d.get("model", "linear")),
                "n": int(d.get("n", 0)),
                "fit": str(d.get("fit", "")),
            }
        except (KeyError, TypeError, ValueError) as e:
            raise TracrError(f"Malformed regression model for {where}: {e}.") from None
        r2 = d.get("r2")
        out["r2"] = None if r2 is None else float(r2)
        return out

    try:
        classes = {str(k): line(v, k) for k, v in dict(models["classes"]).items()}
        every = line(models["all"], "all")
    except (KeyError, TypeError) as e:
        raise TracrError(f"Malformed regression models: missing {e}.") from None
    for k in classes:
        if k not in LAYER_CLASSES:
            raise TracrError(
                f"Unknown layer class '{k}' in regression models.",
                hint=f"Valid classes: {list(LAYER_CLASSES)}.",
            )
    return {
        "feature": "m_bytes",
        "classes": classes,
        "all": every,
        "type_map": {str(k): str(v) for k, v in dict(models.get("type_map") or {}).items()},
    }


def predict_bytes(models: Mapping, row: Mapping) -> float:
    """Eq. 1 prediction (ms) of one layer; never negative (a line can dip below 0)."""
    cls = layer_class(row["type"], models.get("type_map"))
    line = models["classes"].get(cls, models["all"])
    return max(0.0, line["a"] * layer_bytes(row) + line["b"])


def _feature_row(row: Mapping, features: Iterable[str]) -> list[float]:
    return [float(row.get(f) or 0) for f in features]


def _nnls_fit(X: list[list[float]], y: list[float]) -> tuple[list[float], float, str]:
    """Least squares with non-negative coefficients and a free intercept."""
    reg = _sklearn_linear(positive=True)
    import numpy as np

    Xa, ya = np.asarray(X, dtype=float), np.asarray(y, dtype=float)
    if reg is not None:
        reg.fit(Xa, ya)
        return (
            [float(c) for c in reg.coef_],
            float(reg.intercept_),
            "sklearn.LinearRegression(positive=True)",
        )
    # Without scikit-learn: drop the most negative coefficient and refit until
    # none is negative. Not an exact NNLS, but non-negative and close on the
    # well-conditioned data profiles give.
    active = list(range(Xa.shape[1]))
    while True:
        A = np.column_stack([Xa[:, active], np.ones(len(ya))]) if active else np.ones((len(ya), 1))
        sol, *_ = np.linalg.lstsq(A, ya, rcond=None)
        coefs = sol[:-1]
        if not len(coefs) or coefs.min() >= 0:
            break
        active.pop(int(coefs.argmin()))
    full = [0.0] * Xa.shape[1]
    for i, c in zip(active, coefs, strict=True):
        full[i] = float(c)
    return full, float(sol[-1]), "numpy.lstsq(active-set, non-negative)"


def fit_feature_models(
    layers: Sequence[Mapping],
    layer_ms: Sequence[float | None],
    *,
    features: Sequence[str] = FEATURES,
    type_map: Mapping[str, str] | None = None,
) -> dict:
    """Per-class ``t = sum_f w_f * x_f + b`` with ``w_f >= 0`` on ``features``.

    Features are standardized by their class maximum before fitting (bytes and
    FLOPs differ by orders of magnitude); the returned weights are in the
    original units. A class with fewer than two samples keeps only a ratio on
    its largest feature (or its mean), as the paper's model does.
    """
    by_class = _samples(layers, layer_ms, type_map)
    classes = {}
    for cls, samples in sorted(by_class.items()):
        X = [_feature_row(r, features) for r, _ in samples]
        y = [ms for _, ms in samples]
        scale = [max(abs(row[i]) for row in X) or 1.0 for i in range(len(features))]
        if len(samples) < 2:
            best = max(range(len(features)), key=lambda i: X[0][i])
            w = [0.0] * len(features)
            if X[0][best] > 0:
                w[best] = y[0] / X[0][best]
                b, model, fit = 0.0, "ratio", "ratio"
            else:
                b, model, fit = y[0], "constant", "mean"
        else:
            Xs = [[v / s for v, s in zip(row, scale, strict=True)] for row in X]
            ws, b, fit = _nnls_fit(Xs, y)
            w = [wi / s for wi, s in zip(ws, scale, strict=True)]
            model = "linear"
        preds = [sum(wi * xi for wi, xi in zip(w, row, strict=True)) + b for row in X]
        classes[cls] = {
            "weights": dict(zip(features, w, strict=True)),
            "b": b,
            "model": model,
            "n": len(samples),
            "r2": _r2(y, preds),
            "fit": fit,
        }
    return {"features": list(features), "classes": classes, "type_map": dict(type_map or {})}


def predict_features(models: Mapping, row: Mapping) -> float:
    """Prediction (ms) of one layer from a ``fit_feature_models`` dict; never negative.

    A layer whose class the device never profiled gets the mean of the
    classes' predictions (no better information exists).
    """
    cls = layer_class(row["type"], models.get("type_map"))
    classes = models["classes"]

    def one(m: Mapping) -> float:
        return sum(m["weights"][f] * float(row.get(f) or 0) for f in models["features"]) + m["b"]

    if cls in classes:
        return max(0.0, one(classes[cls]))
    return max(0.0, sum(one(m) for m in classes.values()) / len(classes))
