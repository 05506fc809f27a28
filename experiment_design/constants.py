"""Names and numbers both sides agree on, torch-free.

The observer validates manifests against these and the participants act on
them; each is defined here once.
"""

from __future__ import annotations

#: blosc2 codecs and filters a manifest's ``transport`` may name.
CODECS = ("none", "zstd", "lz4", "lz4hc", "blosclz", "zlib")
FILTERS = ("none", "shuffle", "bitshuffle")
#: Lossy reductions applied to floating crossing tensors before the codec; jpeg/webp
#: apply only to an image batch (N, C, H, W) with C in (1, 3), such as a model's input.
LOSSY = ("none", "float16", "bfloat16", "int8", "int4", "jpeg", "webp")
#: int8/int4 scale and zero point per tensor, or per channel (dim 1).
GRANULARITIES = ("tensor", "channel")
#: How a model is split: on its fx graph, on module hooks, or graph with hooks as fallback.
SPLIT_MODES = ("auto", "graph", "hooks")
#: ``torchvision:<builder>`` names any torchvision classification builder.
TORCHVISION_PREFIX = "torchvision:"
#: ImageNet channel statistics (torchvision's classification weights expect them).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
