"""Loading real weights without downloading anything."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from experiment_design.errors import TracrError

if TYPE_CHECKING:
    from torch import nn


def _state_dict_from_file(path: Path) -> dict:
    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise TracrError(
            f"cannot read weights file {path}: {exc}",
            hint="give a state_dict saved with torch.save(model.state_dict(), path)",
        ) from exc
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise TracrError(
            f"weights file {path} does not hold a state_dict",
            hint="save it with torch.save(model.state_dict(), path)",
        )
    return obj


def _torchvision_file(torchvision_name: str, weights: str) -> Path:
    import torch
    import torchvision.models as tvm

    try:
        enum = tvm.get_model_weights(torchvision_name)
    except Exception as exc:
        raise TracrError(f"torchvision has no weights for '{torchvision_name}'") from exc
    key = weights.split(".")[-1]
    try:
        entry = enum[key] if key != "DEFAULT" else enum.DEFAULT
    except KeyError:
        valid = ", ".join(["DEFAULT", *(w.name for w in enum)])
        raise TracrError(
            f"unknown weights '{weights}' for {torchvision_name}", hint=f"valid: {valid}"
        ) from None
    hub = Path(torch.hub.get_dir()) / "checkpoints"
    target = hub / os.path.basename(entry.url)
    if not target.exists():
        raise TracrError(
            f"weights {entry.name} for {torchvision_name} are not in the torch hub cache "
            f"(tracr never downloads).",
            hint=f"download {entry.url} and put it at {target}",
        )
    return target


def load_weights(
    model: nn.Module, weights: str, *, torchvision_name: str | None, model_name: str
) -> None:
    """Load ``weights`` (a local state_dict file or a cached torchvision weights name)."""
    path = Path(weights).expanduser()
    looks_like_file = path.suffix in (".pt", ".pth", ".bin") or os.sep in weights
    if path.is_file():
        state = _state_dict_from_file(path)
    elif looks_like_file:
        raise TracrError(f"weights file not found: {path}")
    elif torchvision_name is None:
        raise TracrError(
            f"model '{model_name}' takes weights only from a local state_dict file",
            hint="pass the path of a .pt/.pth file saved with torch.save(model.state_dict(), ...)",
        )
    else:
        state = _state_dict_from_file(_torchvision_file(torchvision_name, weights))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise TracrError(
            f"weights do not match model '{model_name}': {first}",
            hint="the state_dict must come from the same architecture",
        ) from exc
