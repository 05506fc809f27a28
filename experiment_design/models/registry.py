"""The model registry: ``@register_model`` fills it, ``create_model`` builds from it.

Modelled on timm: factories are registered by name together with a
:class:`ModelSpec` (input shape, task). Models are built in ``eval()`` mode with
random weights from a fixed seed unless a weights source is given; nothing is
ever downloaded. Listing names and reading specs imports no torch; building a
model does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from experiment_design.constants import TORCHVISION_PREFIX
from experiment_design.errors import TracrError, UnknownNameError
from experiment_design.models.weights import load_weights
from experiment_design.registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import nn

log = logging.getLogger(__name__)

__all__ = [
    "MODELS",
    "TORCHVISION_PREFIX",
    "ModelSpec",
    "UnknownModelError",
    "create_model",
    "example_input",
    "get_model_spec",
    "list_models",
    "register_missing",
    "register_model",
    "unregister_model",
]

_HINT = "run 'tracr model ls'; any torchvision classifier works as 'torchvision:<name>'"


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
        super().__init__("model", name, valid, hint=hint or _HINT)


#: name -> factory; the modules of ``models/`` and ``models/user/`` register themselves.
MODELS: Registry[Callable[..., nn.Module]] = Registry(
    "model",
    ["experiment_design.models", "experiment_design.models.user"],
    name_attr=None,
    hint=_HINT,
)
# Metadata kept beside the shared registry: name -> spec, and the names that
# would exist with an optional extra installed (name -> install hint).
_SPECS: dict[str, ModelSpec] = {}
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

    Import torch inside the factory, so that listing models stays torch-free.

    Example::

        @register_model("tiny-mlp", input_shape=(16,), description="two linear layers")
        def tiny_mlp() -> nn.Module:
            from torch import nn

            return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    """

    def decorator(factory: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        key = name or factory.__name__
        if key.startswith(TORCHVISION_PREFIX):
            raise ValueError(f"model names may not start with '{TORCHVISION_PREFIX}'")
        doc = (factory.__doc__ or "").strip().splitlines()
        MODELS.add(key, factory)
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
    if not MODELS.has(name):
        _MISSING[name] = hint


def unregister_model(name: str) -> None:
    """Remove ``name`` from the registry (for tests and interactive sessions)."""
    MODELS.remove(name)
    _SPECS.pop(name, None)


def list_models(pattern: str | None = None) -> list[str]:
    """Registered model names, sorted, optionally filtered by an fnmatch ``pattern``.

    ``torchvision:<name>`` models are resolved on demand and not listed.
    """
    return MODELS.names(pattern)


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
    if name.startswith(TORCHVISION_PREFIX):
        spec = _torchvision_spec(name)
    elif name in MODELS and name in _SPECS:
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
    import torch

    spec = get_model_spec(name, weights)
    torch.manual_seed(seed)
    if name.startswith(TORCHVISION_PREFIX):
        import torchvision.models as tvm

        model = tvm.get_model(spec.torchvision_name, weights=None)
    else:
        model = MODELS.get(name)()
    if weights is not None:
        load_weights(model, weights, torchvision_name=spec.torchvision_name, model_name=name)
    return model.eval()


def example_input(name: str, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """A random input of the model's input shape with ``batch`` rows (seeded)."""
    import torch

    spec = get_model_spec(name)
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((batch, *spec.input_shape), generator=gen)
