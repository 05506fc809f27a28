"""The fingerprint of a split model's graph: what partners must agree on to exchange tensors.

Participants may run different torch versions; they interoperate as long as each
traces the model into the same graph. One line per layer (its index, name, type,
the shapes the profile recorded, and the names of the values that cross the cut
after it, which key the tensors on the wire), and a hash over the lines and the
split mode. Each participant computes it after building the model
(``SetupInfo.graph``) and, before it exchanges a tensor, checks its own against
the plan's (``check_graph``, :class:`~experiment_design.protocol.GraphPlan`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.protocol import GraphPlan


class GraphMismatch(TracrError):
    """This participant's graph is not the plan's: the two cannot exchange tensors."""


def _shape(shape: Any) -> str:
    return "x".join(str(d) for d in shape) if shape is not None else "-"


def graph_nodes(split_model: Any) -> list[str]:
    """One line per layer of ``split_model`` (a :class:`~experiment_design.split.SplitModel`)."""
    lines = []
    for info in split_model.layers:
        cross = split_model.points[info.index].crossing
        lines.append(f"{info.index} {info.name} {info.type} "
                     f"in={','.join(_shape(s) for s in info.input_shapes)} "
                     f"out={_shape(info.output_shape)} cross={','.join(cross)}")
    return lines


def graph_digest(mode: str, nodes: list[str]) -> str:
    """The fingerprint: a hash over the split mode and the node lines."""
    h = hashlib.sha256(f"mode={mode}\n".encode())
    for line in nodes:
        h.update(line.encode() + b"\n")
    return h.hexdigest()[:16]


def check_graph(instance: str, torch_version: str, digest: str, nodes: list[str],
                plan: GraphPlan) -> None:
    """Raise :class:`GraphMismatch` when this participant's graph (``digest``, ``nodes``)
    is not ``plan``'s, naming both torch versions and the first node that differs."""
    if digest == plan.digest:
        return
    first = next((i for i, (a, b) in enumerate(zip(nodes, plan.nodes, strict=False))
                  if a != b),
                 min(len(nodes), len(plan.nodes)))  # fmt: skip
    mine = nodes[first] if first < len(nodes) else "(no such node)"
    theirs = plan.nodes[first] if first < len(plan.nodes) else "(no such node)"
    if mine == theirs:  # same nodes, other mode
        mine = theirs = "the split mode differs"
    raise GraphMismatch(
        f"{instance}: its graph ({len(nodes)} nodes, torch {torch_version}) differs from the "
        f"plan's ({plan.reference}: {len(plan.nodes)} nodes, torch {plan.torch}); first "
        f"difference at node {first + 1}: here '{mine}', in the plan '{theirs}'",
        hint="run the same torch and torchvision versions on both devices (or the same "
        "model, depth and mode)",
    )
