"""The role registry: ``@register_role("edge")``, ``get_role``, ``list_roles``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from experiment_design.errors import UnknownNameError

if TYPE_CHECKING:
    from experiment_design.roles.base import ParticipantService

_ROLES: dict[str, type[ParticipantService]] = {}


def register_role(name: str | None = None):
    """Class decorator: register a :class:`ParticipantService` subclass as a role."""

    def deco(cls):
        key = name or cls.__dict__.get("role_name") or cls.__name__.lower()
        cls.role_name = key
        _ROLES[key] = cls
        return cls

    return deco


def _discover() -> None:
    from experiment_design.runtime.discovery import import_submodules

    import_submodules("experiment_design.roles")


def get_role(name: str) -> type[ParticipantService]:
    """The class registered as ``name``."""
    _discover()
    if name not in _ROLES:
        raise UnknownNameError("role", name, _ROLES)
    return _ROLES[name]


def list_roles() -> list[str]:
    """Registered role names, sorted."""
    _discover()
    return sorted(_ROLES)


def role_is(cls: type, name: str) -> bool:
    """True if ``cls`` is (a subclass of) the role registered as ``name``."""
    return issubclass(cls, get_role(name))
