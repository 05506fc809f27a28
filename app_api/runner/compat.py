"""Refuse participant combinations that cannot exchange tensors, before any inference."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.protocol import GraphPlan, SetupInfo

log = logging.getLogger(__name__)


def _major_minor(v: str) -> str:
    return ".".join(v.split("+")[0].split(".")[:2])


def check_environments(envs: dict[str, dict]) -> list[str]:
    """Raise TracrError on a tracr/python-major mismatch; return warnings (torch differences).

    The wire carries dtype names and raw bytes, so torch versions may differ, but the
    graphs must agree; :func:`check_graphs` has each partner verify that after set-up.
    """
    if len(envs) < 2:
        return []
    warnings = []
    for key, norm, hard in (
        ("tracr", lambda v: v, True),
        ("python", lambda v: v.split(".")[0], True),
        ("torch", _major_minor, False),
    ):
        seen = {inst: norm(str(env.get(key))) for inst, env in envs.items()}
        if len(set(seen.values())) > 1:
            detail = ", ".join(f"{i}: {envs[i].get(key)}" for i in seen)
            if hard:
                raise TracrError(
                    f"Participants run different {key} versions ({detail}); they cannot "
                    "exchange tensors reliably.",
                    hint=f"install the same {key} version on every device",
                )
            warnings.append(f"participants run different {key} versions ({detail})")
    for w in warnings:
        log.warning("%s", w)
    return warnings


def check_plans(infos: Mapping[str, SetupInfo | Mapping[str, Any]],
                pairs: list[tuple[str, str]]) -> None:
    """Every pair of partners must number the same layers the same way.

    ``infos``: each participant's set-up reply (a :class:`SetupInfo` or its JSON form).
    """
    for a, b in pairs:
        la = [(r.get("name"), r.get("type")) for r in _setup_info(infos[a]).profile]
        lb = [(r.get("name"), r.get("type")) for r in _setup_info(infos[b]).profile]
        if la != lb:
            first = next((i for i, (x, y) in enumerate(zip(la, lb, strict=False)) if x != y), min(len(la), len(lb)))
            raise TracrError(
                f"{a} and {b} split the model differently ({len(la)} vs {len(lb)} layers, "
                f"first difference at layer {first + 1}).",
                hint="use the same model, depth and mode (and torch/torchvision versions) on both",
            )


def check_graphs(call: Callable[[str, GraphPlan], Any], infos: Mapping[str, SetupInfo],
                 envs: Mapping[str, Mapping[str, Any]], pairs: list[tuple[str, str]]) -> None:
    """Each partner checks its own graph against the plan's before any tensor crosses.

    In a pair (a, b), a connects to b (the edge to the cloud, the head of a chain to a
    stage) and a's graph is the plan: ``call(b, plan)`` asks b to compare (its
    ``check_graph``), which refuses a mismatch naming both torch versions and the first
    node that differs. A pair where one side reports no graph (a role that builds its
    model its own way) falls back to :func:`check_plans`.
    """
    for a, b in pairs:
        ia, ib = _setup_info(infos[a]), _setup_info(infos[b])
        if not ia.graph or not ib.graph:
            check_plans(infos, [(a, b)])
            continue
        call(b, GraphPlan(reference=a, torch=str((envs.get(a) or {}).get("torch", "?")),
                          digest=ia.graph, nodes=list(ia.graph_nodes or [])))


def _setup_info(info: SetupInfo | Mapping[str, Any]) -> SetupInfo:
    return info if isinstance(info, SetupInfo) else SetupInfo.from_dict(dict(info))
