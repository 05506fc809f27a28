"""Model registry: ``create_model(name)``, ``list_models()``, ``@register_model``.

Built-ins: alexnet, vgg16, resnet18, resnet50, mobilenet_v2, efficientnet_b0,
fasterrcnn-backbone, yolov8n (with ``pip install tracr[yolo]``), and any
torchvision classifier as ``torchvision:<name>``.
"""

from experiment_design.models.registry import (
    TORCHVISION_PREFIX,
    ModelSpec,
    UnknownModelError,
    create_model,
    example_input,
    get_model_spec,
    list_models,
    register_model,
    unregister_model,
)

__all__ = [
    "TORCHVISION_PREFIX",
    "ModelSpec",
    "UnknownModelError",
    "create_model",
    "example_input",
    "get_model_spec",
    "list_models",
    "register_model",
    "unregister_model",
]
