"""The plan of a split: per-layer facts and per-cut facts (frozen, printable, JSON-able)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LayerInfo:
    """One layer (1..n in execution order): one row of the profile.

    ``param_bytes`` is the paper's Eq. 2 memory term m_j (sum of precision x count).
    ``flops`` counts a multiply-add as 2; elementwise layers count their output size.
    """

    index: int
    name: str
    type: str
    params: int
    param_bytes: int
    flops: int | None
    input_shapes: tuple[tuple[int, ...], ...]
    output_shape: tuple[int, ...] | None
    input_bytes: int
    output_bytes: int

    def to_dict(self) -> dict:
        """Plain-JSON view (tuples become lists)."""
        d = asdict(self)
        d["input_shapes"] = [list(s) for s in self.input_shapes]
        d["output_shape"] = list(self.output_shape) if self.output_shape is not None else None
        return d


@dataclass(frozen=True)
class SplitPoint:
    """Cut k: the edge runs layers 1..k, the cloud runs k+1..n.

    ``crossing`` names every value produced before the cut and used after it
    (skip connections included), each once: a tuple, list or dict holding tensors
    as its leaves (``name[0]``, ...). ``valid`` is False when one of them is neither
    a tensor nor plain data (ints, sizes, None: ``transport/plain.py``); sweeps skip
    such cuts. ``crossing_bytes`` counts a plain value as its encoded size.
    """

    index: int
    layer: str
    type: str
    crossing: tuple[str, ...]
    crossing_bytes: int
    cum_params: int
    valid: bool

    def to_dict(self) -> dict:
        """Plain-JSON view."""
        d = asdict(self)
        d["crossing"] = list(self.crossing)
        return d


def build_split_points(layers: list[LayerInfo], crossing_of) -> list[SplitPoint]:
    """The n+1 cuts of ``layers``; ``crossing_of(k)`` gives ``(names, bytes, valid)`` of cut k.

    Shared by both engines: they differ only in how they find what crosses a cut.
    """
    points, cum = [], 0
    for k in range(len(layers) + 1):
        if k:
            cum += layers[k - 1].params
        names, nbytes, valid = crossing_of(k)
        points.append(
            SplitPoint(
                index=k,
                layer=layers[k - 1].name if k else "input",
                type=layers[k - 1].type if k else "input",
                crossing=tuple(names),
                crossing_bytes=nbytes,
                cum_params=cum,
                valid=valid,
            )
        )
    return points
