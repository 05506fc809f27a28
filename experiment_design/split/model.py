"""``SplitModel``: one model, every cut, each side computing only its own layers."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor, nn

from experiment_design.constants import SPLIT_MODES
from experiment_design.errors import TracrError
from experiment_design.split.engine import SplitEngine
from experiment_design.split.graph import GraphEngine, check_depth
from experiment_design.split.hooks import HookEngine
from experiment_design.split.outputs import max_abs_diff
from experiment_design.split.types import LayerInfo, SplitPoint

log = logging.getLogger(__name__)

#: kept under its old name for existing imports
MODES = SPLIT_MODES


class SplitModel:
    """A model prepared for splitting at every valid cut k in 0..n.

    Layers are numbered 1..n in execution order; cut k runs layers 1..k on the
    edge and k+1..n on the cloud (k=0: the input crosses; k=n: the output
    crosses). ``mode`` is "graph" (torch.fx) or "hooks" (forward-hook fallback).

    Example::

        sm = SplitModel.build(model, torch.randn(1, 3, 224, 224))
        crossing, edge_ms = sm.run_prefix(5, x, timed=True)   # on the edge
        out, cloud_ms = sm.run_suffix(5, crossing, timed=True)  # on the cloud
    """

    def __init__(
        self, model: nn.Module, engine: SplitEngine, example: Tensor, depth: int | None
    ) -> None:
        self.model = model
        self.engine = engine
        self.example = example
        self.depth = depth
        #: where the model runs (see :meth:`to`)
        self.device: torch.device = example.device
        self.mode: str = engine.mode
        self.layers: list[LayerInfo] = engine.layers
        self.points: list[SplitPoint] = engine.points

    @classmethod
    def build(
        cls,
        model: nn.Module,
        example_input: Tensor,
        *,
        depth: int | None = None,
        mode: str = "auto",
    ) -> SplitModel:
        """Trace (or record) ``model`` on ``example_input``; "auto" falls back to hooks."""
        if mode not in SPLIT_MODES:
            raise TracrError(
                f"unknown split mode '{mode}'", hint=f"use one of {', '.join(SPLIT_MODES)}"
            )
        check_depth(model, depth)
        model.eval()
        if mode in ("auto", "graph"):
            try:
                engine: SplitEngine = GraphEngine(model, example_input, depth)
            except Exception as exc:
                if mode == "graph" and isinstance(exc, TracrError):
                    raise
                if mode == "graph":
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    raise TracrError(
                        f"torch.fx cannot trace {type(model).__name__}: {first}",
                        hint="use --mode hooks (or auto) for models with data-dependent control flow",
                    ) from exc
                log.info("fx tracing failed (%s); using hooks mode", exc)
                engine = HookEngine(model, example_input, depth)
        else:
            engine = HookEngine(model, example_input, depth)
        return cls(model, engine, example_input, depth)

    def to(self, device: torch.device | str) -> SplitModel:
        """Move the model, the engine's own modules and the example input to ``device``.

        ``device`` is a torch device or its name, or ``"auto"`` (CUDA when available,
        else the CPU). Asking for CUDA where there is none is a :class:`TracrError`.
        Afterwards :attr:`device` says where the model runs.
        """
        dev = resolve_device(device)
        self.model.to(dev)
        self.engine.to(dev)
        self.example = self.example.to(dev)
        self.device = dev
        return self

    @property
    def n(self) -> int:
        """Number of layers."""
        return len(self.layers)

    def valid_splits(self) -> list[int]:
        """Cut indices whose crossing values are all tensors."""
        return [p.index for p in self.points if p.valid]

    def _check(self, k: int) -> None:
        if not 0 <= k <= self.n:
            raise TracrError(f"split {k} is out of range", hint=f"use 0..{self.n}")
        if not self.points[k].valid:
            raise TracrError(
                f"split {k} ({self.points[k].layer}) is not a valid cut: a non-tensor value crosses it",
                hint="pick one of valid_splits()",
            )

    def prepare(self, side: str, splits: list[int] | None = None, *, timed: bool = True) -> int:
        """Build the code of one side ("prefix" or "suffix") for each cut in ``splits``
        (default: every valid cut) ahead of time.

        The graph engine generates each side's code on first use. Done inside a timed
        inference, that one-off cost (milliseconds, growing with the side's length)
        would land in the first measurement at every new split, and on a CPU-quota'd
        host it would also spend the quota the layers then wait for. Returns how many
        were built (0 in hooks mode, which has nothing to build).
        """
        if side not in ("prefix", "suffix"):
            raise TracrError(f"unknown side '{side}'", hint="use prefix or suffix")
        ks = self.valid_splits() if splits is None else list(splits)
        for k in ks:
            self._check(k)
        on_cuda = next(self.model.parameters(), torch.empty(0)).device.type == "cuda"
        return self.engine.prepare(side, ks, timed, on_cuda)

    def run_prefix(
        self, k: int, x: Tensor, *, timed: bool = False
    ) -> tuple[dict[str, Tensor], list[tuple[int, float]]]:
        """Run layers 1..k; return the crossing tensors (name -> tensor) and per-layer ms."""
        self._check(k)
        with torch.no_grad():
            return self.engine.run_prefix(k, x, timed)

    def run_suffix(
        self, k: int, crossing: dict[str, Tensor], *, timed: bool = False
    ) -> tuple[Any, list[tuple[int, float]]]:
        """Run layers k+1..n from the crossing tensors; never recomputes layers 1..k."""
        self._check(k)
        missing = [n for n in self.points[k].crossing if n not in crossing]
        if missing:
            raise TracrError(f"split {k}: crossing tensors missing: {', '.join(missing)}")
        with torch.no_grad():
            return self.engine.run_suffix(k, crossing, timed)

    def run_full(self, x: Tensor, *, timed: bool = False) -> tuple[Any, list[tuple[int, float]]]:
        """Run the whole model through the engine (per-layer ms of 1..n if timed)."""
        with torch.no_grad():
            return self.engine.run_full(x, timed)

    def verify(self, k: int, x: Tensor) -> float:
        """Max abs difference between the split run at k and ``model(x)``."""
        with torch.no_grad():
            ref = self.model(x)
            crossing, _ = self.run_prefix(k, x)
            out, _ = self.run_suffix(k, crossing)
        return max_abs_diff(out, ref)

    def profile(self) -> list[dict]:
        """Plain-JSON rows: LayerInfo fields plus ``crossing_bytes`` of cut k=index."""
        rows = []
        for info in self.layers:
            row = info.to_dict()
            point = self.points[info.index]
            row["crossing_bytes"] = point.crossing_bytes
            row["valid"] = point.valid
            rows.append(row)
        return rows


def resolve_device(device: torch.device | str) -> torch.device:
    """``device`` as a torch device; ``"auto"`` is CUDA when available, else the CPU."""
    want = str(device)
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want.startswith("cuda") and not torch.cuda.is_available():
        raise TracrError(
            f"device '{want}' requested but CUDA is not available",
            hint="use settings.device: cpu (or auto)",
        )
    return torch.device(want)


def build_split_model(
    name: str,
    *,
    seed: int = 0,
    weights: str | None = None,
    depth: int | None = None,
    mode: str = "auto",
    batch: int = 1,
    input_shape: tuple[int, ...] | None = None,
) -> SplitModel:
    """Create registered model ``name`` and prepare it for splitting.

    ``input_shape`` (no batch dim) overrides the model's default, e.g. its
    ``min_input_shape`` for quick checks.
    """
    from experiment_design.models import create_model, example_input, get_model_spec

    if batch < 1:
        raise TracrError(f"batch must be >= 1 (got {batch})")
    model = create_model(name, seed=seed, weights=weights)
    if input_shape is None:
        x = example_input(name, batch=batch, seed=seed)
    else:
        get_model_spec(name)
        x = torch.randn((batch, *input_shape), generator=torch.Generator().manual_seed(seed))
    return SplitModel.build(model, x, depth=depth, mode=mode)
