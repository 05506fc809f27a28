"""The role registry: ``@register_role("edge")``, ``get_role``, ``list_roles``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from experiment_design.registry import Registry

if TYPE_CHECKING:
    from experiment_design.roles.base import ParticipantService

#: name -> ParticipantService subclass; every module of ``experiment_design.roles`` is
#: imported on lookup. A role's name is kept in its ``role_name`` attribute.
ROLES: Registry[type[ParticipantService]] = Registry(
    "role", ["experiment_design.roles"], name_attr="role_name"
)


def register_role(
    name: str | None = None,
) -> Callable[[type[ParticipantService]], type[ParticipantService]]:
    """Class decorator: register a :class:`ParticipantService` subclass as a role."""
    return ROLES.register(name)


def get_role(name: str) -> type[ParticipantService]:
    """The class registered as ``name``."""
    return ROLES.get(name)


def list_roles() -> list[str]:
    """Registered role names, sorted."""
    return ROLES.names()


def role_is(cls: type, name: str) -> bool:
    """True if ``cls`` is (a subclass of) the role registered as ``name``."""
    return issubclass(cls, get_role(name))
