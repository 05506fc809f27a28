"""Split engine: cut a model at any layer; each side computes only its own layers.

``SplitModel.build(model, x)`` traces the model with torch.fx ("graph" mode) or,
when that is impossible, records it with forward hooks ("hooks" mode). Cut k
runs layers 1..k on the edge and k+1..n on the cloud; every value that crosses
the cut (skip connections included) is sent once.
"""

from experiment_design.split.engine import SplitEngine
from experiment_design.split.model import MODES, SplitModel, build_split_model, resolve_device
from experiment_design.split.outputs import flatten_output, max_abs_diff
from experiment_design.split.types import LayerInfo, SplitPoint

__all__ = [
    "MODES",
    "LayerInfo",
    "SplitEngine",
    "SplitModel",
    "SplitPoint",
    "build_split_model",
    "flatten_output",
    "max_abs_diff",
    "resolve_device",
]
