"""Detection backbones with real multi-output skip structure."""

from __future__ import annotations

from typing import TYPE_CHECKING

from experiment_design.models.registry import register_model

if TYPE_CHECKING:
    from torch import nn


@register_model(
    "fasterrcnn-backbone",
    task="features",
    min_input_shape=(3, 32, 32),
    description="Faster R-CNN ResNet-50 FPN backbone (returns 5 feature maps)",
)
def fasterrcnn_backbone() -> nn.Module:
    """ResNet-50 + FPN from torchvision's Faster R-CNN; output: OrderedDict of feature maps."""
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    return resnet_fpn_backbone(backbone_name="resnet50", weights=None, trainable_layers=5)
