"""``SplitModel``: one model, every cut, each side computing only its own layers."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor, nn

from experiment_design.constants import SPLIT_MODES
from experiment_design.errors import TracrError
from experiment_design.models import create_model, example_input, get_model_spec
from experiment_design.split.engine import SplitEngine, Timings
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

    A pipeline over several devices chains stages: stage (a, b) runs layers
    a+1..b, from the crossing tensors of cut a to those of cut b::

        crossing, _ = sm.run_stage(0, 5, x)           # device 1
        crossing, _ = sm.run_stage(5, 9, crossing)    # device 2
        out, _ = sm.run_stage(9, sm.n, crossing)      # device 3: the model output
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
        #: the key of the model input among crossing tensors: cut 0's crossing is (input_name,)
        self.input_name: str = engine.input_name

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
        """Cut indices whose crossing values can all cross (tensors and plain data)."""
        return [p.index for p in self.points if p.valid]

    def _check(self, k: int) -> None:
        if not 0 <= k <= self.n:
            raise TracrError(f"split {k} is out of range", hint=f"use 0..{self.n}")
        if not self.points[k].valid:
            raise TracrError(
                f"split {k} ({self.points[k].layer}) is not a valid cut: a value that is "
                "neither a tensor nor plain data crosses it",
                hint="pick one of valid_splits()",
            )

    def _check_stage(self, a: int, b: int) -> None:
        self._check(a)
        self._check(b)
        if a > b:
            raise TracrError(
                f"stage {a}..{b} runs backwards: it starts after cut {a} and ends at cut {b}",
                hint=f"a stage (a, b) runs layers a+1..b with 0 <= a <= b <= {self.n}",
            )

    def _check_crossing(self, k: int, crossing: dict[str, Any]) -> None:
        missing = [n for n in self.points[k].crossing if n not in crossing]
        if missing:
            raise TracrError(f"split {k}: crossing tensors missing: {', '.join(missing)}")

    def _on_cuda(self) -> bool:
        return next(self.model.parameters(), torch.empty(0)).device.type == "cuda"

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
        return self.engine.prepare(side, ks, timed, self._on_cuda())

    def prepare_segments(self, pairs: list[tuple[int, int]], *, timed: bool = True) -> int:
        """Build the code of each stage (a, b) in ``pairs`` ahead of time (see :meth:`prepare`).

        Covers :meth:`run_segment` and :meth:`run_stage` for every pair: the segment
        a..b, and for a last stage (b == n) also the suffix of cut a that
        ``run_stage`` runs. Returns how many were built (0 in hooks mode).
        """
        pairs = [(a, b) for a, b in pairs]  # tuples: they key the engine's code cache
        for a, b in pairs:
            self._check_stage(a, b)
        cuda = self._on_cuda()
        built = self.engine.prepare("segment", pairs, timed, cuda)
        lasts = sorted({a for a, b in pairs if b == self.n})
        return built + self.engine.prepare("suffix", lasts, timed, cuda)

    def run_prefix(
        self, k: int, x: Tensor, *, timed: bool = False
    ) -> tuple[dict[str, Any], list[tuple[int, float]]]:
        """Run layers 1..k; return the crossing values (name -> tensor or plain data, see
        :mod:`experiment_design.transport.plain`) and per-layer ms."""
        self._check(k)
        with torch.no_grad():
            return self.engine.run_prefix(k, x, timed)

    def run_suffix(
        self, k: int, crossing: dict[str, Any], *, timed: bool = False
    ) -> tuple[Any, list[tuple[int, float]]]:
        """Run layers k+1..n from the crossing tensors; never recomputes layers 1..k."""
        self._check(k)
        self._check_crossing(k, crossing)
        with torch.no_grad():
            return self.engine.run_suffix(k, crossing, timed)

    def run_segment(
        self, a: int, b: int, crossing: dict[str, Any], *, timed: bool = False
    ) -> tuple[dict[str, Any], Timings]:
        """Run layers a+1..b from the crossing tensors of cut a; return those of cut b
        (name -> tensor, in ``points[b].crossing`` order) and per-layer ms of a+1..b.

        Tensors of cut b made at or before cut a (long skip connections through this
        stage, see :meth:`passthrough`) are the received objects, handed on untouched.
        ``a == b`` runs nothing. ``run_segment(0, b, {input_name: x})`` equals
        ``run_prefix(b, x)``; the model output needs ``run_suffix`` (or :meth:`run_stage`).
        """
        self._check_stage(a, b)
        self._check_crossing(a, crossing)
        with torch.no_grad():
            return self.engine.run_segment(a, b, crossing, timed)

    def run_stage(
        self, a: int, b: int, crossing: dict[str, Any] | Tensor, *, timed: bool = False
    ) -> tuple[Any, Timings]:
        """One pipeline stage: layers a+1..b, so that every stage is the same call.

        Takes the crossing tensors of cut a (the first stage, a == 0, may pass the input
        tensor itself instead of ``{input_name: x}``). Returns the crossing tensors of
        cut b as :meth:`run_segment` does, except for the last stage (b == n), which
        returns the model output as :meth:`run_suffix` does; and per-layer ms of a+1..b.
        """
        self._check_stage(a, b)
        if isinstance(crossing, Tensor):
            if a != 0:
                raise TracrError(
                    f"stage {a}..{b} got an input tensor: only the first stage (a = 0) takes one",
                    hint=f"give it the crossing tensors of cut {a}",
                )
            crossing = {self.input_name: crossing}
        if b == self.n:
            return self.run_suffix(a, crossing, timed=timed)
        return self.run_segment(a, b, crossing, timed=timed)

    def passthrough(self, a: int, b: int) -> tuple[str, ...]:
        """Names of the crossing tensors of cut b that stage (a, b) only forwards: made at
        or before cut a and used after b (long skip connections), in cut b's order."""
        self._check_stage(a, b)
        before = set(self.points[a].crossing)
        return tuple(name for name in self.points[b].crossing if name in before)

    def run_full(self, x: Tensor, *, timed: bool | str = False
                 ) -> tuple[Any, list[tuple[int, float]]]:
        """Run the whole model through the engine (per-layer ms of 1..n if timed; with
        ``timed="cpu"`` the process's CPU ms per layer, on a CPU device)."""
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
        """Plain-JSON rows: LayerInfo fields plus ``crossing_bytes`` of cut k=index and
        ``activation_bytes``: the bytes of every activation alive once layer k has run (each
        tensor made at or before k that a later layer reads, skip connections and the input
        included), which is what a cut there must hold and send: the crossing bytes."""
        rows = []
        for info in self.layers:
            row = info.to_dict()
            point = self.points[info.index]
            row["crossing_bytes"] = point.crossing_bytes
            row["activation_bytes"] = point.crossing_bytes
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
    if batch < 1:
        raise TracrError(f"batch must be >= 1 (got {batch})")
    model = create_model(name, seed=seed, weights=weights)
    if input_shape is None:
        x = example_input(name, batch=batch, seed=seed)
    else:
        get_model_spec(name)
        x = torch.randn((batch, *input_shape), generator=torch.Generator().manual_seed(seed))
    return SplitModel.build(model, x, depth=depth, mode=mode)
