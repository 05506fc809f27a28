"""Roles: the participant services (rpyc) users subclass.

Built-ins: ``edge`` (:class:`EdgeRole`) and ``cloud`` (:class:`CloudRole`).
Every module in this package is imported on first registry use, so a new
file with an ``@register_role`` class is picked up by name.
"""

from __future__ import annotations

from experiment_design.roles.base import ParticipantService
from experiment_design.roles.registry import get_role, list_roles, register_role, role_is

__all__ = ["ParticipantService", "get_role", "list_roles", "register_role", "role_is"]


def __getattr__(name: str):
    # EdgeRole/CloudRole import the split engine and transport: load them on demand.
    if name in ("EdgeRole", "CloudRole"):
        from experiment_design.roles.cloud import CloudRole
        from experiment_design.roles.edge import EdgeRole

        return {"EdgeRole": EdgeRole, "CloudRole": CloudRole}[name]
    raise AttributeError(name)
