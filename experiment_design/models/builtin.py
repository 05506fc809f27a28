"""The built-in classifiers (torchvision architectures, random init unless weights are given)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from experiment_design.models.registry import register_model

if TYPE_CHECKING:
    from torch import nn


def _tv(name: str) -> nn.Module:
    import torchvision.models as tvm

    return tvm.get_model(name, weights=None)


@register_model(
    "alexnet",
    min_input_shape=(3, 64, 64),
    torchvision_name="alexnet",
    description="AlexNet (the SEC '23 paper's model)",
)
def alexnet() -> nn.Module:
    """AlexNet."""
    return _tv("alexnet")


@register_model(
    "vgg16", min_input_shape=(3, 32, 32), torchvision_name="vgg16", description="VGG-16"
)
def vgg16() -> nn.Module:
    """VGG-16."""
    return _tv("vgg16")


@register_model(
    "resnet18",
    min_input_shape=(3, 32, 32),
    torchvision_name="resnet18",
    description="ResNet-18 (skip connections)",
)
def resnet18() -> nn.Module:
    """ResNet-18."""
    return _tv("resnet18")


@register_model(
    "resnet50", min_input_shape=(3, 32, 32), torchvision_name="resnet50", description="ResNet-50"
)
def resnet50() -> nn.Module:
    """ResNet-50."""
    return _tv("resnet50")


@register_model(
    "mobilenet_v2",
    min_input_shape=(3, 32, 32),
    torchvision_name="mobilenet_v2",
    description="MobileNetV2 (inverted residuals)",
)
def mobilenet_v2() -> nn.Module:
    """MobileNetV2."""
    return _tv("mobilenet_v2")


@register_model(
    "efficientnet_b0",
    min_input_shape=(3, 32, 32),
    torchvision_name="efficientnet_b0",
    description="EfficientNet-B0 (squeeze-excitation)",
)
def efficientnet_b0() -> nn.Module:
    """EfficientNet-B0."""
    return _tv("efficientnet_b0")
