"""The cloud role: the last stage of the edge/cloud pair, serving every edge it is wired to."""

from __future__ import annotations

from experiment_design.roles.registry import register_role
from experiment_design.roles.stage import StageRole


@register_role("cloud")
class CloudRole(StageRole):
    """Accepts authenticated data channels, runs the layers after each cut, returns the
    (small) result. Its suffix code for every cut is built at set-up.

    The reply header carries the cloud's own durations (decode_ms, compute_ms,
    per-layer ms), each measured on this host's clock.
    """

    partners: dict[str, str] = {}
    side = "suffix"
