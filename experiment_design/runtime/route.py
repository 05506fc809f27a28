"""A route: which participant of a chain runs which layers of one inference.

With ``route = (p0, p1, ..., p_{k-1})`` and ``cuts = (c1, ..., c_{k-1})``, participant
``p_i`` runs layers ``c_i + 1 .. c_{i+1}`` (``c_0 = 0``, ``c_k = n``); :func:`run_range`
runs one such range of a split model. The chain that carries an inference along its route
is :mod:`experiment_design.runtime.chain`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from experiment_design.errors import TracrError


@dataclass(frozen=True)
class Route:
    """Who runs which layers of one inference (see the module docstring)."""

    route: tuple[str, ...]
    cuts: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.route) < 1 or len(self.cuts) != len(self.route) - 1:
            raise TracrError(f"a route of {len(self.route)} participants needs "
                             f"{max(0, len(self.route) - 1)} cuts, got {list(self.cuts)}")
        if any(b < a for a, b in zip(self.cuts, self.cuts[1:], strict=False)):
            raise TracrError(f"cuts must not decrease along the route: {list(self.cuts)}")
        if len(set(self.route)) != len(self.route):
            raise TracrError(f"a participant appears twice in the route {list(self.route)}")

    @property
    def k(self) -> int:
        """Number of stages."""
        return len(self.route)

    def bounds(self, hop: int, n: int) -> tuple[int, int]:
        """The cuts around stage ``hop``: it runs layers ``a + 1 .. b``."""
        a = 0 if hop == 0 else self.cuts[hop - 1]
        b = n if hop == len(self.cuts) else self.cuts[hop]
        return a, b

    @property
    def label(self) -> str:
        """The cuts as a label, e.g. ``"8/40"`` (``"-"`` for one stage)."""
        return "/".join(map(str, self.cuts)) or "-"

    def to_header(self) -> dict[str, Any]:
        """The route's part of a frame header."""
        return {"route": list(self.route), "cuts": list(self.cuts)}

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Route:
        """The route a frame header carries."""
        return cls(tuple(str(r) for r in header["route"]), tuple(int(c) for c in header["cuts"]))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON view."""
        return {**self.to_header(), "label": self.label}


def run_range(sm: Any, a: int, b: int, tensors: dict[str, Any], timed: bool, *,
              last: bool) -> tuple[Any, list]:
    """Layers ``a + 1 .. b`` of split model ``sm`` from the crossing tensors of cut ``a``
    (the input under its crossing name when ``a == 0``): the model output if this is the
    ``last`` stage (then ``b == n``), else the crossing tensors of cut ``b``; with
    per-layer ms if ``timed``."""
    n = sm.n
    if last and b != n:
        raise TracrError(f"the last stage must end at the last cut ({n}), not at {b}")
    if a == 0:
        (x,) = tensors.values()
        return sm.run_full(x, timed=timed) if last else sm.run_prefix(b, x, timed=timed)
    if last:
        return sm.run_suffix(a, tensors, timed=timed)
    if b == n:
        raise TracrError(f"a middle stage cannot end at the last cut ({n}): only the head "
                         "may run every layer and send the output on")
    return sm.run_stage(a, b, tensors, timed=timed)
