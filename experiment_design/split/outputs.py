"""Helpers over model outputs and crossing values: flatten, classify, compare, count bytes.

What may cross a cut is decided here, once, for both engines: tensors, plain data
(ints, sizes, None, ...: :func:`~experiment_design.transport.plain.is_plain`), and
tuples, lists and dicts holding tensors, which cross as their leaves (``name[0]``,
``name[1]``, ...) and are rebuilt on the far side.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from experiment_design.transport.plain import is_plain, plain_nbytes


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


def _holds_tensor(obj: Any) -> bool:
    return isinstance(obj, (tuple, list, dict)) and next(iter_tensors(obj), None) is not None


def leaves(base: str, v: Any) -> list[tuple[str, Any]]:
    """(name, leaf) pairs of a crossing value: a tuple, list or dict holding a tensor is
    taken apart (``base[0]``, ``base[key]``, nested), anything else is one leaf."""
    if not _holds_tensor(v):
        return [(base, v)]
    items = v.items() if isinstance(v, dict) else enumerate(v)
    return [p for key, item in items for p in leaves(f"{base}[{key}]", item)]


def rebuild(base: str, like: Any, crossing: dict[str, Any]) -> Any:
    """The value named ``base`` put back together from its :func:`leaves` in ``crossing``;
    ``like`` (the value recorded when profiling) gives the structure."""
    if not _holds_tensor(like):
        return crossing[base]
    if isinstance(like, dict):
        return type(like)(
            (key, rebuild(f"{base}[{key}]", item, crossing)) for key, item in like.items()
        )
    items = [rebuild(f"{base}[{j}]", item, crossing) for j, item in enumerate(like)]
    return type(like)(*items) if hasattr(like, "_fields") else type(like)(items)


def crosses(v: Any) -> bool:
    """True if ``v`` can cross a cut: every leaf is a tensor or plain data."""
    return all(isinstance(leaf, Tensor) or is_plain(leaf) for _, leaf in leaves("", v))


def crossing_nbytes(v: Any) -> int:
    """Bytes ``v`` puts on the wire: its tensors' bytes, plus each plain leaf's encoded
    size (0 for a leaf that cannot cross)."""
    total = 0
    for _, leaf in leaves("", v):
        if isinstance(leaf, Tensor):
            total += leaf.numel() * leaf.element_size()
        elif is_plain(leaf):
            total += plain_nbytes(leaf)
    return total


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
