"""Graph-mode splitting: torch.fx traces the model; each side gets its own generated code.

fx generates one Python line per graph node. For cut k the prefix is the
lines of layers 1..k returning the crossing values; the suffix is a function
whose parameters are the crossing values and whose body is the lines of
layers k+1..n, so the side after the cut never replays the prefix. A segment
(a, b), one stage of a pipeline, is both at once: its parameters are the
crossing values of cut a, its body the lines of layers a+1..b, and it returns
the crossing values of cut b (those made before a are its own parameters,
handed on untouched). Each is compiled once and run against the traced module
tree (shared weights).
Timed variants put a clock read between consecutive lines (no interpreter in
the loop). If fx's code cannot be cut per node, the same cuts are built as
fx GraphModules instead.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import torch
from torch import Tensor, fx, nn

from experiment_design.errors import TracrError
from experiment_design.split.clock import layer_clock, ticks_to_ms
from experiment_design.split.outputs import (
    crosses,
    crossing_nbytes,
    leaves,
    nbytes,
    on_cuda,
    param_count_bytes,
    rebuild,
)
from experiment_design.split.profile import FlopMeter
from experiment_design.split.types import LayerInfo, SplitPoint, build_split_points

log = logging.getLogger(__name__)

#: what one piece of generated code is built for: a cut k, or a segment's cuts (a, b)
Piece = int | tuple[int, int]


def _extra_leaves() -> tuple[type, ...]:
    try:
        from torchvision.ops.misc import FrozenBatchNorm2d

        return (FrozenBatchNorm2d,)
    except Exception:  # torchvision is optional here
        return ()


class DepthTracer(fx.Tracer):
    """fx tracer whose leaves are torch.nn modules, or every module at ``depth`` (torchinfo depth)."""

    def __init__(self, depth: int | None = None) -> None:
        super().__init__()
        self.depth = depth
        self._extra = _extra_leaves()

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        """Leaf if a standard layer, or if at the chosen depth."""
        if self._extra and isinstance(m, self._extra):
            return True
        if self.depth is not None and module_qualified_name:
            if module_qualified_name.count(".") + 1 >= self.depth:
                return True
        return super().is_leaf_module(m, module_qualified_name)


def module_depth(model: nn.Module) -> int:
    """The deepest module nesting level (torchinfo's depth; 0 for a leaf model)."""
    return max((n.count(".") + 1 for n, _ in model.named_modules() if n), default=0)


def check_depth(model: nn.Module, depth: int | None) -> None:
    """Raise a TracrError for a depth outside 1..deepest."""
    if depth is None:
        return
    deepest = module_depth(model)
    if depth < 1 or depth > deepest:
        raise TracrError(
            f"depth {depth} is out of range for this model",
            hint=f"use a depth between 1 and {deepest}, or leave it out for every graph node",
        )


def _type_name(node: fx.Node, gm: fx.GraphModule) -> str:
    if node.op == "call_module":
        return type(gm.get_submodule(node.target)).__name__
    if node.op == "call_method":
        return str(node.target)
    return getattr(node.target, "__name__", str(node.target))


class _Recorder(fx.Interpreter):
    """One profiling pass: values' sizes and each node's FLOPs (not used for timing)."""

    def __init__(self, gm: fx.GraphModule, meter: FlopMeter):
        super().__init__(gm)
        self.meter = meter
        self.facts: dict[fx.Node, dict] = {}

    def run_node(self, n: fx.Node) -> Any:
        self.meter.start()
        out = super().run_node(n)
        ins = [a for a in n.all_input_nodes if a in self.facts]
        names = leaves(n.name, out)
        self.facts[n] = {
            "crosses": crosses(out),
            "leaves": tuple(name for name, _ in names),
            # structures holding tensors cross as their leaves; kept to rebuild them
            "like": out if names[0][0] != n.name else None,
            "cross_bytes": crossing_nbytes(out),
            "bytes": nbytes(out),
            "shape": tuple(out.shape) if isinstance(out, Tensor) else None,
            "flops": self.meter.stop(_type_name(n, self.module), out)
            if n.op not in ("placeholder", "output", "get_attr")
            else 0,
            "input_shapes": tuple(
                self.facts[a]["shape"] for a in ins if self.facts[a]["shape"] is not None
            ),
            "input_bytes": sum(self.facts[a]["bytes"] for a in ins),
        }
        return out


class GraphEngine:
    """Split engine over a torch.fx graph (see module docstring)."""

    mode = "graph"

    def __init__(self, model: nn.Module, example: Tensor, depth: int | None = None) -> None:
        check_depth(model, depth)
        tracer = DepthTracer(depth)
        graph = tracer.trace(model)  # raises on data-dependent control flow
        self.gm = fx.GraphModule(tracer.root, graph, model.__class__.__name__)
        self.graph = graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        used = [p for p in placeholders if p.users]  # unused *args/**kwargs are fine
        if not placeholders or len(used) > 1:
            raise TracrError(
                f"graph mode needs a model with exactly one tensor input (found {len(used)})",
                hint="use --mode hooks",
            )
        self.input_node = used[0] if used else placeholders[0]
        self.input_name = self.input_node.name
        self.output_node = next(n for n in graph.nodes if n.op == "output")
        self.layer_nodes = [
            n for n in graph.nodes if n.op in ("call_module", "call_function", "call_method")
        ]
        self.pos = {n: i + 1 for i, n in enumerate(self.layer_nodes)}
        self.pos[self.input_node] = 0
        self.n = len(self.layer_nodes)
        self.pos[self.output_node] = self.n + 1
        with torch.no_grad(), FlopMeter() as meter:
            rec = _Recorder(self.gm, meter)
            rec.run(example)
        self.facts = rec.facts
        self._last_use = {
            p: max((self._position(u) for u in p.users), default=-1)
            for p in [self.input_node, *self.layer_nodes]
        }
        self.layers = self._layer_infos()
        self.points = self._split_points()
        self._cache: dict[tuple, Any] = {}
        self._lines: dict[str, str] | None = None
        if not self._split_source():
            log.info("generated code not one line per node; building GraphModules")

    def _position(self, node: fx.Node) -> int:
        if node in self.pos:
            return self.pos[node]
        # get_attr users: replicated on both sides; their own users decide.
        return max((self._position(u) for u in node.users), default=-1)

    # ---- plan -------------------------------------------------------------
    def crossing_nodes(self, k: int) -> list[fx.Node]:
        """Values produced at positions <= k and used after k, in production order."""
        producers = [self.input_node, *self.layer_nodes[:k]]
        return [p for p in producers if self._last_use[p] > k]

    def _layer_infos(self) -> list[LayerInfo]:
        infos, seen = [], set()
        counts: dict[str, int] = {}
        for n in self.layer_nodes:
            if n.op == "call_module":
                counts[n.target] = counts.get(n.target, 0) + 1
        for n in self.layer_nodes:
            f = self.facts[n]
            params = pbytes = 0
            name = n.name
            if n.op == "call_module":
                if counts[n.target] == 1:
                    name = n.target
                if n.target not in seen:  # a reused module's weights live on one side once
                    seen.add(n.target)
                    params, pbytes = param_count_bytes(self.gm.get_submodule(n.target))
            infos.append(
                LayerInfo(
                    index=self.pos[n],
                    name=name,
                    type=_type_name(n, self.gm),
                    params=params,
                    param_bytes=pbytes,
                    flops=f["flops"],
                    input_shapes=f["input_shapes"],
                    output_shape=f["shape"],
                    input_bytes=f["input_bytes"],
                    output_bytes=f["bytes"],
                )
            )
        return infos

    def _split_points(self) -> list[SplitPoint]:
        # per cut: its crossing nodes, and whether one of them crosses as its leaves
        self._cross: list[list[fx.Node]] = []
        self._structured: list[bool] = []

        def crossing_of(k: int):
            cross = self.crossing_nodes(k)
            self._cross.append(cross)
            self._structured.append(any(self.facts[c]["like"] is not None for c in cross))
            return (
                [name for c in cross for name in self.facts[c]["leaves"]],
                sum(self.facts[c]["cross_bytes"] for c in cross),
                all(self.facts[c]["crosses"] for c in cross) and bool(cross),
            )

        return build_split_points(self.layers, crossing_of)

    def _pack(self, k: int, vals: Any) -> dict[str, Any]:
        """The crossing values of cut k (by name) from its crossing nodes' values."""
        if not self._structured[k]:
            return dict(zip(self.points[k].crossing, vals, strict=True))
        out: dict[str, Any] = {}
        for c, v in zip(self._cross[k], vals, strict=True):
            out.update(leaves(c.name, v))
        return out

    def _unpack(self, k: int, crossing: dict[str, Any]) -> list[Any]:
        """The values of cut k's crossing nodes, structures rebuilt from their leaves."""
        if not self._structured[k]:
            return [crossing[n] for n in self.points[k].crossing]
        return [rebuild(c.name, self.facts[c]["like"], crossing) for c in self._cross[k]]

    # ---- code generation --------------------------------------------------
    def _split_source(self) -> bool:
        """Cut fx's generated forward into one line per node, once; False if it cannot."""
        code = self.graph.python_code(root_module="self")
        lines: dict[str, str] = {}
        ret = None
        in_body = False
        for raw in code.src.splitlines():
            line = raw.strip()
            if line.startswith("def forward("):
                in_body = True
                continue
            # module-level prelude (fx.wrap registrations) is not part of the body
            if not in_body or not line or line.startswith("#"):
                continue
            if line.startswith("return "):
                ret = line[len("return ") :]
                continue
            m = _ASSIGN.match(line)
            if not m or m.group(1) in lines:
                return False
            lines[m.group(1)] = line
        wanted = [n.name for n in self.graph.nodes if n.op not in ("placeholder", "output")]
        if ret is None or set(wanted) != set(lines):
            return False
        self._lines = lines
        self._return = ret
        self._globals = dict(code.globals)
        return True

    def _span(self, k: Piece, side: str) -> tuple[int, int, list[fx.Node], list[fx.Node] | None]:
        """Layers lo..hi of one piece of code, its parameters, and the values it returns
        (None: the model output).

        ``k`` is a cut for "prefix", "suffix" and "full", and a pair of cuts (a, b)
        for "segment".
        """
        if side == "segment":
            a, b = k
            return a + 1, b, self.crossing_nodes(a), self.crossing_nodes(b)
        if side == "prefix":
            return 1, k, [self.input_node], self.crossing_nodes(k)
        if side == "suffix":
            return k + 1, self.n, self.crossing_nodes(k), None
        return 1, self.n, [self.input_node], None

    def _source(self, k: Piece, side: str, timed: bool) -> str:
        lo, hi, params, returns = self._span(k, side)
        if returns is None:
            result = self._return
        else:
            result = "(" + "".join(f"{c.name}, " for c in returns) + ")"
        body = ["_t0 = _clock()"] if timed else []
        ticks = 0
        for n in self.graph.nodes:
            if n.op == "get_attr":
                if any(lo <= self._position(u) <= hi for u in n.users):
                    body.append(self._lines[n.name])
            elif n.op not in ("placeholder", "output") and lo <= self.pos[n] <= hi:
                body.append(self._lines[n.name])
                if timed:
                    ticks += 1
                    body.append(f"_t{ticks} = _clock()")
        if timed:
            result = f"({result}, ({''.join(f'_t{i}, ' for i in range(ticks + 1))}))"
        body.append(f"return {result}")
        sig = ", ".join(["self", *(p.name for p in params)])
        return f"def forward({sig}):\n" + "".join(f"    {b}\n" for b in body)

    def _compile(self, k: Piece, side: str, clock) -> Any:
        if self._lines is None:
            return self._build_fx(k, side, clock)
        src = self._source(k, side, clock is not None)
        env = dict(self._globals)
        env["_clock"] = clock
        exec(compile(src, f"<tracr {side} {_label(k)}>", "exec"), env)
        return _Compiled(env["forward"], self.gm, src)

    def _module(self, k: Piece, side: str, clock) -> Any:
        key = (k, side, clock)
        fn = self._cache.get(key)
        if fn is None:
            fn = self._cache[key] = self._compile(k, side, clock)
        return fn

    def prepare(self, side: str, splits: list[Piece], timed: bool, cuda: bool) -> int:
        """Generate and compile ``side`` at every cut (every (a, b) pair for "segment")
        in ``splits`` now, not at first use."""
        clock = layer_clock(timed, cuda)
        for k in splits:
            self._module(k, side, clock)
        return len(splits)

    def _build_fx(self, k: Piece, side: str, clock) -> fx.GraphModule:
        """The same piece as an fx GraphModule (slower to build; used when codegen slicing fails)."""
        g = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        ticks: list[fx.Node] = []
        lo, hi, params, returns = self._span(k, side)
        for p in params:
            env[p] = g.node_copy(p) if p.op == "placeholder" else g.placeholder(p.name)
        if clock is not None:
            ticks.append(g.call_function(clock))
        for n in self.graph.nodes:
            if n.op == "get_attr":
                if any(lo <= self._position(u) <= hi for u in n.users):
                    env[n] = g.node_copy(n, env.__getitem__)
            elif n.op not in ("placeholder", "output") and lo <= self.pos[n] <= hi:
                env[n] = g.node_copy(n, env.__getitem__)
                if clock is not None:
                    ticks.append(g.call_function(clock))
        if returns is None:
            result: Any = fx.node.map_arg(self.output_node.args[0], env.__getitem__)
        else:
            result = tuple(env[c] for c in returns)
        g.output((result, tuple(ticks)) if clock is not None else result)
        return fx.GraphModule(self.gm, g, f"{side.capitalize()}{_label(k, '_')}")

    # ---- execution --------------------------------------------------------
    def run_prefix(self, k: int, x: Tensor, timed: bool = False):
        """Crossing values of cut k and, if timed, per-layer ms of layers 1..k."""
        clock = layer_clock(timed, on_cuda(x))
        out = self._module(k, "prefix", clock)(x)
        if clock is None:
            return self._pack(k, out), []
        vals, ticks = out
        return self._pack(k, vals), ticks_to_ms(1, ticks)

    def run_suffix(self, k: int, crossing: dict[str, Any], timed: bool = False):
        """Model output from the crossing values; per-layer ms of layers k+1..n if timed."""
        args = self._unpack(k, crossing)
        clock = layer_clock(timed, on_cuda(args))
        out = self._module(k, "suffix", clock)(*args)
        if clock is None:
            return out, []
        result, ticks = out
        return result, ticks_to_ms(k + 1, ticks)

    def run_segment(self, a: int, b: int, crossing: dict[str, Any], timed: bool = False):
        """Crossing values of cut b from those of cut a; per-layer ms of layers a+1..b if timed.

        Values of cut b made before a are the very objects received.
        """
        args = self._unpack(a, crossing)
        clock = layer_clock(timed, on_cuda(args))
        out = self._module((a, b), "segment", clock)(*args)
        if clock is None:
            return self._pack(b, out), []
        vals, ticks = out
        return self._pack(b, vals), ticks_to_ms(a + 1, ticks)

    def run_full(self, x: Tensor, timed: bool | str = False):
        """The whole model through the engine (``timed="cpu"``: per-layer CPU ms)."""
        if not timed:
            return self.gm(x), []
        result, ticks = self._module(self.n, "full", layer_clock(timed, on_cuda(x)))(x)
        return result, ticks_to_ms(1, ticks)

    def to(self, device: torch.device) -> None:
        """Move the traced module tree (the model's submodules and the constants the trace kept)."""
        self.gm.to(device)

    def suffix_graph_module(self, k: int) -> fx.GraphModule:
        """The untimed suffix of cut k as an fx GraphModule (for inspection)."""
        return self._build_fx(k, "suffix", None)


_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) = ")


def _label(k: Piece, sep: str = "..") -> str:
    """A cut, or a segment's pair of cuts joined by ``sep``, for code and class names."""
    return sep.join(map(str, k)) if isinstance(k, tuple) else str(k)


class _Compiled:
    """A generated forward bound to the traced module tree (shared, not copied)."""

    def __init__(self, fn, root: nn.Module, src: str) -> None:
        self.fn = fn
        self.root = root
        self.src = src

    def __call__(self, *args: Any) -> Any:
        return self.fn(self.root, *args)
