"""The model registry: ``@register_model`` fills it, ``create_model`` builds from it.

Modelled on timm: factories are registered by name together with a
:class:`ModelSpec` (input shape, task). Models are built in ``eval()`` mode with
random weights from a fixed seed unless a weights source is given; nothing is
ever downloaded.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from experiment_design.errors import TracrError, UnknownNameError

log = logging.getLogger(__name__)

TORCHVISION_PREFIX = "torchvision:"


@dataclass(frozen=True)
class ModelSpec:
    """What the rest of tracr needs to know about a registered model.

    ``input_shape`` has no batch dimension. ``min_input_shape`` is the smallest
    input the model accepts (used for fast checks); ``pretrained`` is False when
    the weights are random, so accuracy figures can be labelled as such.
    """

    name: str
    input_shape: tuple[int, ...] = (3, 224, 224)
    task: str = "classification"
    description: str = ""
    pretrained: bool = False
    min_input_shape: tuple[int, ...] | None = None
    torchvision_name: str | None = None


class UnknownModelError(UnknownNameError):
    """A model name that is neither registered nor a ``torchvision:<name>`` model."""

    def __init__(self, name: str, valid, hint: str | None = None):
        super().__init__(
            "model",
            name,
            valid,
            hint=hint
            or "run 'tracr model ls'; any torchvision classifier works as 'torchvision:<name>'",
        )


_FACTORIES: dict[str, Callable[..., nn.Module]] = {}
_SPECS: dict[str, ModelSpec] = {}
# Names that would exist with an optional extra installed: name -> hint.
_MISSING: dict[str, str] = {}


def register_model(
    name: str | None = None,
    *,
    input_shape: tuple[int, ...] = (3, 224, 224),
    task: str = "classification",
    description: str = "",
    min_input_shape: tuple[int, ...] | None = None,
    torchvision_name: str | None = None,
) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Register ``factory(**kwargs) -> nn.Module`` under ``name`` (default: the function name).

    Example::

        @register_model("tiny-mlp", input_shape=(16,), description="two linear layers")
        def tiny_mlp() -> nn.Module:
            return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    """

    def decorator(factory: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        key = name or factory.__name__
        if key.startswith(TORCHVISION_PREFIX):
            raise ValueError(f"model names may not start with '{TORCHVISION_PREFIX}'")
        doc = (factory.__doc__ or "").strip().splitlines()
        _FACTORIES[key] = factory
        _SPECS[key] = ModelSpec(
            name=key,
            input_shape=tuple(input_shape),
            task=task,
            description=description or (doc[0] if doc else ""),
            min_input_shape=tuple(min_input_shape) if min_input_shape else None,
            torchvision_name=torchvision_name,
        )
        _MISSING.pop(key, None)
        return factory

    return decorator


def register_missing(name: str, hint: str) -> None:
    """Record that ``name`` needs an optional extra; creating it raises with ``hint``."""
    if name not in _FACTORIES:
        _MISSING[name] = hint


def unregister_model(name: str) -> None:
    """Remove ``name`` from the registry (for tests and interactive sessions)."""
    _FACTORIES.pop(name, None)
    _SPECS.pop(name, None)


def list_models(pattern: str | None = None) -> list[str]:
    """Registered model names, sorted, optionally filtered by an fnmatch ``pattern``.

    ``torchvision:<name>`` models are resolved on demand and not listed.
    """
    _ensure_loaded()
    names = sorted(_FACTORIES)
    if pattern:
        names = [n for n in names if fnmatch.fnmatch(n, pattern)]
    return names


def _torchvision_classifiers() -> list[str]:
    import torchvision.models as tvm

    return sorted(tvm.list_models(module=tvm))


def _torchvision_spec(name: str) -> ModelSpec:
    tv = name[len(TORCHVISION_PREFIX) :]
    valid = _torchvision_classifiers()
    if tv not in valid:
        raise UnknownNameError(
            "torchvision classification model",
            tv,
            valid,
            hint="only classification models of torchvision.models are available by name",
        )
    shape = (3, 299, 299) if tv == "inception_v3" else (3, 224, 224)
    return ModelSpec(
        name=name,
        input_shape=shape,
        description=f"torchvision.models.{tv}",
        torchvision_name=tv,
    )


def get_model_spec(name: str, weights: str | None = None) -> ModelSpec:
    """The :class:`ModelSpec` of ``name``; ``pretrained`` reflects ``weights``."""
    _ensure_loaded()
    if name.startswith(TORCHVISION_PREFIX):
        spec = _torchvision_spec(name)
    elif name in _SPECS:
        spec = _SPECS[name]
    elif name in _MISSING:
        raise TracrError(f"model '{name}' needs an optional dependency.", hint=_MISSING[name])
    else:
        raise UnknownModelError(name, list_models())
    return replace(spec, pretrained=weights is not None)


def create_model(name: str, *, seed: int = 0, weights: str | None = None) -> nn.Module:
    """Build model ``name`` in eval mode: random init from ``seed``, or ``weights``.

    ``weights`` is a local ``.pt``/``.pth`` state_dict file, or a torchvision
    weights name (e.g. ``IMAGENET1K_V1``) whose file is already in the torch hub
    cache. Nothing is downloaded.
    """
    spec = get_model_spec(name, weights)
    torch.manual_seed(seed)
    if name.startswith(TORCHVISION_PREFIX):
        import torchvision.models as tvm

        model = tvm.get_model(spec.torchvision_name, weights=None)
    else:
        model = _FACTORIES[name]()
    if weights is not None:
        from experiment_design.models.weights import load_weights

        load_weights(model, weights, torchvision_name=spec.torchvision_name, model_name=name)
    return model.eval()


def example_input(name: str, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """A random input of the model's input shape with ``batch`` rows (seeded)."""
    spec = get_model_spec(name)
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((batch, *spec.input_shape), generator=gen)


_LOADED = False


def _ensure_loaded() -> None:
    """Import the built-in and user model modules once (they register themselves)."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    from experiment_design.models import discover

    discover.import_model_modules()
