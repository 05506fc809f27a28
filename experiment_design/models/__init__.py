"""Model registry: ``create_model(name)``, ``list_models()``, ``@register_model``.

Built-ins: alexnet, vgg16, resnet18, resnet50, mobilenet_v2, efficientnet_b0,
fasterrcnn-backbone, yolov8n (with ``pip install tracr[yolo]``), and any
torchvision classifier as ``torchvision:<name>``. Every module of this package
and of ``user/`` is imported on lookup (see :class:`experiment_design.registry.Registry`).
"""

from experiment_design.models.registry import (
    MODELS,
    TORCHVISION_PREFIX,
    ModelSpec,
    UnknownModelError,
    create_model,
    example_input,
    get_model_spec,
    list_models,
    register_missing,
    register_model,
    unregister_model,
)

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
