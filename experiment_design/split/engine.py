"""``SplitEngine``: what :class:`~experiment_design.split.model.SplitModel` asks of an engine.

Two engines satisfy it: :class:`~experiment_design.split.graph.GraphEngine`
(torch.fx) and :class:`~experiment_design.split.hooks.HookEngine` (forward hooks).
Both are built from a model and an example input, number the layers 1..n and
describe the n+1 cuts with the same frozen plan objects (:mod:`.types`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from experiment_design.split.types import LayerInfo, SplitPoint

#: per-layer timings: (layer index, milliseconds)
Timings = list[tuple[int, float]]


@runtime_checkable
class SplitEngine(Protocol):
    """Runs any side of any cut of one model; ``SplitModel`` checks the arguments first."""

    #: "graph" or "hooks"
    mode: str
    #: layers 1..n in execution order
    layers: list[LayerInfo]
    #: cuts 0..n
    points: list[SplitPoint]
    #: the model input's name: cut 0's crossing is ``(input_name,)``
    input_name: str

    def prepare(
        self, side: str, splits: list[int] | list[tuple[int, int]], timed: bool, cuda: bool
    ) -> int:
        """Build the code of ``side`` ("prefix"/"suffix" for each cut, "segment" for each
        (a, b) pair of cuts) now; how many were built."""
        ...

    def run_prefix(self, k: int, x: Tensor, timed: bool = False) -> tuple[dict[str, Tensor], Timings]:
        """Layers 1..k: the crossing tensors by name, and per-layer ms if timed."""
        ...

    def run_suffix(
        self, k: int, crossing: dict[str, Tensor], timed: bool = False
    ) -> tuple[Any, Timings]:
        """Layers k+1..n from the crossing tensors: the output, and per-layer ms if timed."""
        ...

    def run_segment(
        self, a: int, b: int, crossing: dict[str, Tensor], timed: bool = False
    ) -> tuple[dict[str, Tensor], Timings]:
        """Layers a+1..b from the crossing tensors of cut a: those of cut b by name (the ones
        made before a are the received objects themselves), and per-layer ms if timed."""
        ...

    def run_full(self, x: Tensor, timed: bool | str = False) -> tuple[Any, Timings]:
        """Layers 1..n: the output, and per-layer ms if timed."""
        ...

    def to(self, device: torch.device) -> None:
        """Move what the engine holds besides the model itself (e.g. the traced module tree)."""
        ...
