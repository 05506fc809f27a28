"""Names and numbers both sides agree on, torch-free.

The observer validates manifests against these and the participants act on
them; each is defined here once.
"""

from __future__ import annotations

#: blosc2 codecs and filters a manifest's ``transport`` may name.
CODECS = ("none", "zstd", "lz4", "lz4hc", "blosclz", "zlib")
FILTERS = ("none", "shuffle", "bitshuffle")
#: How a model is split: on its fx graph, on module hooks, or graph with hooks as fallback.
SPLIT_MODES = ("auto", "graph", "hooks")
#: ``torchvision:<builder>`` names any torchvision classification builder.
TORCHVISION_PREFIX = "torchvision:"
#: ImageNet channel statistics (torchvision's classification weights expect them).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
