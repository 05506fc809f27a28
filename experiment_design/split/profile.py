"""FLOP counting for the per-layer profile.

Convolutions, linear layers and matmuls are counted from their shapes by
``torch.utils.flop_counter`` (a multiply-add counts 2); layers it does not
count (activations, additions, pooling) are approximated by their output size;
pure view/shape operations count 0.
"""

from __future__ import annotations

import contextlib
from typing import Any

from torch import Tensor

from experiment_design.split.outputs import iter_tensors

# Operations that move no data (views, shape queries): no FLOPs.
_NO_COMPUTE = {
    "size",
    "dim",
    "getitem",
    "getattr",
    "view",
    "reshape",
    "flatten",
    "contiguous",
    "permute",
    "transpose",
    "squeeze",
    "unsqueeze",
    "expand",
    "chunk",
    "split",
    "Identity",
    "Flatten",
    "Dropout",
    "type",
    "to",
}


class FlopMeter:
    """Counts FLOPs of consecutive sections of one forward pass."""

    def __init__(self) -> None:
        self._counter = None
        self._stack = contextlib.ExitStack()
        self._mark = 0

    def __enter__(self) -> FlopMeter:
        try:
            from torch.utils.flop_counter import FlopCounterMode

            self._counter = self._stack.enter_context(FlopCounterMode(display=False))
        except Exception:  # older torch: fall back to output-size estimates only
            self._counter = None
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def start(self) -> None:
        """Mark the beginning of a section."""
        self._mark = self._total()

    def stop(self, type_name: str, output: Any) -> int:
        """FLOPs since :meth:`start` for a layer of ``type_name`` that produced ``output``."""
        counted = self._total() - self._mark
        if counted:
            return int(counted)
        if type_name in _NO_COMPUTE:
            return 0
        return int(sum(t.numel() for t in iter_tensors(output) if isinstance(t, Tensor)))

    def _total(self) -> int:
        return int(self._counter.get_total_flops()) if self._counter is not None else 0
