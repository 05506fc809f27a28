"""Hooks-mode splitting, for models torch.fx cannot trace (e.g. YOLOv8's Detect head).

Units are modules at one depth (by default the top-level children, descending
through single containers such as ultralytics' ``model.model``). One recorded
forward pass finds which earlier unit outputs each later unit consumes: tensor
identity at unit boundaries, carried through the glue code between units by a
TorchFunctionMode that propagates "depends on unit i" to every tensor the glue
creates. Nothing is hand-written per model. A unit that consumes a tensor of
unknown origin (made by a factory or outside torch) makes every cut before it
invalid, since stubs could not reproduce that tensor.

Prefix for cut k: run the model and stop (exception) after unit k, keeping the
outputs that later units consume. Suffix: run the model with units 1..k replaced
by stubs that return the received tensors (or ``torch.empty`` placeholders for
values nobody after the cut uses), so units 1..k are not recomputed; only the
cheap glue code between units runs again. A segment (a, b), one stage of a
pipeline, combines both: units 1..a are stubs, the pass stops after unit b. The
prefix is the segment (0, k).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from experiment_design.errors import TracrError
from experiment_design.split.clock import layer_clock, spans_to_ms
from experiment_design.split.graph import check_depth
from experiment_design.split.outputs import (
    crosses,
    crossing_nbytes,
    iter_tensors,
    leaves,
    nbytes,
    on_cuda,
    param_count_bytes,
    rebuild,
)
from experiment_design.split.profile import FlopMeter
from experiment_design.split.types import LayerInfo, SplitPoint, build_split_points

log = logging.getLogger(__name__)

INPUT = "input"


class _EarlyExit(Exception):
    """Raised by the hook of the last prefix unit to stop the forward pass."""


def select_units(model: nn.Module, depth: int | None) -> list[tuple[str, nn.Module]]:
    """Modules at ``depth`` (plus shallower leaves); default: children, through single containers."""
    check_depth(model, depth)
    if depth is None:
        units = list(model.named_children())
        while len(units) == 1 and any(True for _ in units[0][1].children()):
            prefix, parent = units[0]
            units = [(f"{prefix}.{n}", c) for n, c in parent.named_children()]
        return units
    out = []
    for name, m in model.named_modules():
        if not name:
            continue
        d = name.count(".") + 1
        if d == depth or (d < depth and not any(True for _ in m.children())):
            out.append((name, m))
    return out


class _Provenance(TorchFunctionMode):
    """Tags every tensor made by glue code with the units whose outputs it depends on."""

    def __init__(self, engine_state: dict):
        super().__init__()
        self.s = engine_state

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.s["inside"] is None:
            known = [
                self.s["deps"][id(t)]
                for t in iter_tensors((args, kwargs))
                if id(t) in self.s["deps"]
            ]
            if not known:
                # made from nothing we tracked (a factory, numpy): origin unknown
                return out
            deps = set().union(*known)
            for t in iter_tensors(out):
                self.s["keep"].append(t)
                self.s["deps"][id(t)] = self.s["deps"].get(id(t), set()) | deps
        return out


class HookEngine:
    """Split engine over module hooks (see module docstring)."""

    mode = "hooks"
    input_name = INPUT

    def __init__(self, model: nn.Module, example: Tensor, depth: int | None = None) -> None:
        self.model = model
        candidates = select_units(model, depth)
        if not candidates:
            raise TracrError("the model has no submodules to split at", hint="use --mode graph")
        self._record(example, candidates)
        self.n = len(self.units)
        self.layers = self._layer_infos()
        self.points = self._split_points()

    # ---- recording ---------------------------------------------------------
    def _record(self, x: Tensor, candidates: list[tuple[str, nn.Module]]) -> None:
        s: dict[str, Any] = {"inside": None, "deps": {id(x): {0}}, "keep": [x]}
        order: list[int] = []  # candidate indices in call order
        facts: dict[int, dict] = {}
        meter = FlopMeter()
        weights = {id(t) for t in (*self.model.parameters(), *self.model.buffers())}

        def pre(ci: int):
            def hook(mod, args, kwargs):
                if ci in facts:
                    raise TracrError(
                        f"module '{candidates[ci][0]}' runs more than once per forward pass",
                        hint="hooks mode needs each unit to run once; try another --depth",
                    )
                deps: set[int] = set()
                untracked = False
                for t in iter_tensors((args, kwargs)):
                    if id(t) in s["deps"]:
                        deps |= s["deps"][id(t)]
                    elif id(t) not in weights:
                        untracked = True
                facts[ci] = {
                    "deps": deps,
                    "untracked": untracked,
                    "input_shapes": tuple(tuple(t.shape) for t in iter_tensors((args, kwargs))),
                    "input_bytes": nbytes((args, kwargs)),
                }
                order.append(ci)
                s["inside"] = ci
                meter.start()

            return hook

        def post(ci: int):
            def hook(mod, args, kwargs, out):
                s["inside"] = None
                pos = len(order)  # 1-based position of this unit
                f = facts[ci]
                f["flops"] = meter.stop(type(mod).__name__, out)
                f["out"] = out
                for t in iter_tensors(out):
                    s["keep"].append(t)
                    # a unit may hand back a tensor it was given (Identity, in-place ops):
                    # then both the earlier and this unit's output must cross
                    s["deps"][id(t)] = s["deps"].get(id(t), set()) | {pos}

            return hook

        handles = []
        for ci, (_, m) in enumerate(candidates):
            handles.append(m.register_forward_pre_hook(pre(ci), with_kwargs=True))
            handles.append(m.register_forward_hook(post(ci), with_kwargs=True))
        try:
            with torch.no_grad(), meter, _Provenance(s):
                out = self.model(x)
        finally:
            for h in handles:
                h.remove()
        self.reference = out
        self.example = x
        self.units = [candidates[ci] for ci in order]
        self.facts = [facts[ci] for ci in order]
        self.out_deps: set[int] = set()
        for t in iter_tensors(out):
            self.out_deps |= s["deps"].get(id(t), set())
        # unit position (0 = input) -> last position that needs it (n+1 = the output)
        n = len(order)
        self._last_use = {0: -1, **{i: -1 for i in range(1, n + 1)}}
        for j, f in enumerate(self.facts, start=1):
            for i in f["deps"]:
                self._last_use[i] = max(self._last_use[i], j)
        for i in self.out_deps:
            self._last_use[i] = n + 1
        # A unit that consumes a tensor of unknown origin (not a unit output, not
        # derived from one by torch ops: e.g. made via numpy or a factory) cannot
        # be fed correctly behind stubs, so no cut before it is valid.
        self._last_untracked = max(
            (j for j, f in enumerate(self.facts, start=1) if f["untracked"]), default=0
        )
        if any(id(t) not in s["deps"] and id(t) not in weights for t in iter_tensors(out)):
            self._last_untracked = n + 1

    # ---- plan --------------------------------------------------------------
    def crossing_units(self, k: int) -> list[int]:
        """Unit positions (0 = the input) whose outputs must cross cut k."""
        return [i for i in range(0, k + 1) if self._last_use[i] > k]

    def _value(self, i: int) -> Any:
        return self.example if i == 0 else self.facts[i - 1]["out"]

    def _names(self, i: int) -> list[str]:
        base = INPUT if i == 0 else self.units[i - 1][0]
        return [name for name, _ in leaves(base, self._value(i))]

    def _layer_infos(self) -> list[LayerInfo]:
        infos = []
        for i, ((name, m), f) in enumerate(zip(self.units, self.facts, strict=True), start=1):
            params, pbytes = param_count_bytes(m)
            out = f["out"]
            infos.append(
                LayerInfo(
                    index=i,
                    name=name,
                    type=type(m).__name__,
                    params=params,
                    param_bytes=pbytes,
                    flops=f["flops"],
                    input_shapes=f["input_shapes"],
                    output_shape=tuple(out.shape) if isinstance(out, Tensor) else None,
                    input_bytes=f["input_bytes"],
                    output_bytes=nbytes(out),
                )
            )
        return infos

    def _split_points(self) -> list[SplitPoint]:
        def crossing_of(k: int):
            units = self.crossing_units(k)
            return (
                [nm for i in units for nm in self._names(i)],
                sum(crossing_nbytes(self._value(i)) for i in units),
                bool(units)
                and all(crosses(self._value(i)) for i in units)
                and not 0 < k < self._last_untracked,
            )

        return build_split_points(self.layers, crossing_of)

    # ---- execution ---------------------------------------------------------
    def _timing_hooks(self, lo: int, hi: int, clock: Callable[[], Any], sink: list):
        """Hooks that append ``(unit, start tick, end tick)`` to ``sink`` as units run;
        :func:`spans_to_ms` turns them into ms once the pass is over (on a GPU the ticks
        are events, read after one wait)."""
        handles = []
        for i in range(lo, hi + 1):
            m = self.units[i - 1][1]
            start: list[Any] = [0]

            def pre(mod, args, _s=start):
                _s[0] = clock()

            def post(mod, args, out, _s=start, _i=i):
                sink.append((_i, _s[0], clock()))

            handles.append(m.register_forward_pre_hook(pre))
            handles.append(m.register_forward_hook(post))
        return handles

    def prepare(
        self, side: str, splits: list[int] | list[tuple[int, int]], timed: bool, cuda: bool
    ) -> int:
        """Nothing to build ahead: hooks are registered per pass."""
        return 0

    def to(self, device: torch.device) -> None:
        """Nothing to move: hooks run the model itself, and suffix placeholders are made
        on the crossing tensors' device."""

    def run_prefix(self, k: int, x: Tensor, timed: bool = False):
        """Crossing tensors of cut k; per-unit ms of units 1..k if timed."""
        return self.run_segment(0, k, {INPUT: x}, timed)

    def run_segment(self, a: int, b: int, crossing: dict[str, Any], timed: bool = False):
        """Crossing tensors of cut b from those of cut a; per-unit ms of units a+1..b if timed.

        The pass runs with units 1..a stubbed out and stops after unit b; values of
        cut b made before a are the very tensors received.
        """
        wanted = self.crossing_units(b)
        got: dict[int, Any] = {}
        spans: list[tuple] = []
        if b > a:
            with self._stubbed(a, crossing) as x:
                handles = []
                if timed:
                    # timing hooks first: hooks run in registration order and unit b's
                    # keep-hook ends the pass
                    clock = layer_clock(True, on_cuda(x))
                    handles = self._timing_hooks(a + 1, b, clock, spans)
                for i in range(a + 1, b + 1):

                    def keep(mod, args, out, _i=i):
                        if _i in wanted:
                            got[_i] = out
                        if _i == b:
                            raise _EarlyExit

                    handles.append(self.units[i - 1][1].register_forward_hook(keep))
                try:
                    with torch.no_grad():
                        self.model(x)
                except _EarlyExit:
                    pass
                finally:
                    for h in handles:
                        h.remove()
        out: dict[str, Tensor] = {}
        for i in wanted:
            if i <= a:
                out.update((name, crossing[name]) for name in self._names(i))
            else:
                out.update(leaves(self.units[i - 1][0], got[i]))
        return out, spans_to_ms(spans)

    def run_suffix(self, k: int, crossing: dict[str, Any], timed: bool = False):
        """Model output from the crossing tensors, units 1..k stubbed out."""
        spans: list[tuple] = []
        with self._stubbed(k, crossing) as x:
            handles = []
            if timed:
                clock = layer_clock(True, on_cuda(x))
                handles = self._timing_hooks(k + 1, self.n, clock, spans)
            try:
                with torch.no_grad():
                    out = self.model(x)
            finally:
                for h in handles:
                    h.remove()
        return out, spans_to_ms(spans)

    @contextmanager
    def _stubbed(self, k: int, crossing: dict[str, Any]) -> Iterator[Any]:
        """Units 1..k replaced by stubs for the duration; yields the input to run the model on.

        A stub returns what was received for its unit, or ``torch.empty`` placeholders
        of the recorded shapes (batch scaled) for values nobody after cut k uses.
        The input is the received one when given (always for a prefix), else such a
        placeholder.
        """
        scale_from = self.example.shape[0]
        some = next(iter_tensors(list(crossing.values())), None)
        if some is None:  # only plain values cross: nothing says where or how many
            device, batch = self.example.device, scale_from
        else:
            device, batch = some.device, some.shape[0]

        def empty_like_recorded(t: Tensor) -> Tensor:
            shape = list(t.shape)
            if shape and shape[0] == scale_from:
                shape[0] = batch
            return torch.empty(shape, dtype=t.dtype, device=device)

        def placeholder(v: Any) -> Any:
            if isinstance(v, Tensor):
                return empty_like_recorded(v)
            if isinstance(v, (tuple, list)):
                return type(v)(placeholder(t) for t in v)
            if isinstance(v, dict):
                return type(v)((key, placeholder(t)) for key, t in v.items())
            return v

        def received(i: int) -> Any:
            base = INPUT if i == 0 else self.units[i - 1][0]
            return rebuild(base, self._value(i), crossing)

        cross_units = set(self.crossing_units(k))
        x = crossing[INPUT] if INPUT in crossing else empty_like_recorded(self.example)
        stubbed = []
        try:
            for i in range(1, k + 1):
                m = self.units[i - 1][1]
                value = received(i) if i in cross_units else placeholder(self._value(i))
                m.forward = _Stub(value)
                stubbed.append(m)
            yield x
        finally:
            for m in stubbed:
                del m.forward

    def run_full(self, x: Tensor, timed: bool | str = False):
        """The whole model, with per-unit timing hooks if timed (``"cpu"``: CPU ms)."""
        spans: list[tuple] = []
        handles = []
        if timed:
            handles = self._timing_hooks(1, self.n, layer_clock(timed, on_cuda(x)), spans)
        try:
            with torch.no_grad():
                out = self.model(x)
        finally:
            for h in handles:
                h.remove()
        return out, spans_to_ms(spans)


class _Stub:
    """Stands in for a unit's forward: returns what was received for it."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.value
