"""YOLOv8n from the ``ultralytics`` package (optional extra ``tracr[yolo]``).

Built from the model yaml with random init; nothing is fetched (no weights, no
fonts, no online checks).
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING

from experiment_design.models.registry import register_missing, register_model

if TYPE_CHECKING:
    from torch import nn

_HINT = "install the optional extra: pip install tracr[yolo]  (or: pip install ultralytics)"

if importlib.util.find_spec("ultralytics") is not None:

    @register_model(
        "yolov8n",
        input_shape=(3, 640, 640),
        task="detection",
        min_input_shape=(3, 160, 160),
        description="YOLOv8n (ultralytics; skip connections, multi-scale head)",
    )
    def yolov8n() -> nn.Module:
        """YOLOv8n detection model, built from ``yolov8n.yaml``."""
        # ultralytics probes the network at import unless told it is offline.
        os.environ.setdefault("YOLO_OFFLINE", "1")
        os.environ.setdefault("YOLO_VERBOSE", "False")
        # keep ultralytics' settings file with tracr's config, not in ~/.config/Ultralytics
        tracr_dir = os.environ.get("TRACR_CONFIG_DIR") or os.path.expanduser("~/.config/tracr")
        os.environ.setdefault("YOLO_CONFIG_DIR", os.path.join(tracr_dir, "ultralytics"))
        from ultralytics.nn.tasks import DetectionModel

        return DetectionModel("yolov8n.yaml", nc=80, verbose=False)

else:
    register_missing("yolov8n", _HINT)
