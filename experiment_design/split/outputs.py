"""Helpers over model outputs: flatten nested outputs, compare them, count bytes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor


def iter_tensors(obj: Any) -> Iterator[Tensor]:
    """Every tensor in a nested tuple/list/dict structure, in a stable order."""
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from iter_tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from iter_tensors(item)


def flatten_output(out: Any) -> list[Tensor]:
    """The tensors of a model output (tensor, or nested tuple/list/dict of tensors)."""
    return list(iter_tensors(out))


def max_abs_diff(a: Any, b: Any) -> float:
    """Largest absolute elementwise difference between two outputs of the same structure.

    Returns ``inf`` when the structures or shapes differ.
    """
    ta, tb = flatten_output(a), flatten_output(b)
    if len(ta) != len(tb):
        return float("inf")
    worst = 0.0
    for x, y in zip(ta, tb, strict=True):
        if x.shape != y.shape:
            return float("inf")
        if x.numel() == 0:
            continue
        d = (x.detach().float().cpu() - y.detach().float().cpu()).abs().max().item()
        if d != d:  # NaN on either side is a mismatch
            return float("inf")
        worst = max(worst, d)
    return worst


def nbytes(obj: Any) -> int:
    """Bytes held by the tensors in ``obj`` (nested structures allowed)."""
    return sum(t.numel() * t.element_size() for t in iter_tensors(obj))


def is_flat_tensors(obj: Any) -> bool:
    """True for a tensor, or a tuple/list whose items are all tensors (sendable as is)."""
    if isinstance(obj, Tensor):
        return True
    return (
        isinstance(obj, (tuple, list)) and len(obj) > 0 and all(isinstance(t, Tensor) for t in obj)
    )


def shape_of(obj: Any) -> tuple[int, ...] | None:
    """The shape of a tensor, else None."""
    return tuple(obj.shape) if isinstance(obj, Tensor) else None


def on_cuda(obj: Any) -> bool:
    """True if the first tensor in ``obj`` lives on a CUDA device."""
    for t in iter_tensors(obj):
        return t.is_cuda
    return False


def param_count_bytes(module: torch.nn.Module) -> tuple[int, int]:
    """(parameter count, parameter bytes) of ``module``: Eq. 2's m_j = sum precision * count."""
    count = size = 0
    for p in module.parameters():
        count += p.numel()
        size += p.numel() * p.element_size()
    return count, size
