"""Roles: the participant services (rpyc) users subclass.

Built-ins: ``edge`` (:class:`EdgeRole`) and ``cloud`` (:class:`CloudRole`).
Every module in this package is imported on first registry use, so a new
file with an ``@register_role`` class is picked up by name.
"""

from __future__ import annotations

from experiment_design.roles.base import ParticipantService
from experiment_design.roles.cloud import CloudRole
from experiment_design.roles.edge import EdgeRole
from experiment_design.roles.registry import get_role, list_roles, register_role, role_is

__all__ = [
    "CloudRole", "EdgeRole", "ParticipantService", "get_role", "list_roles", "register_role",
    "role_is",
]

