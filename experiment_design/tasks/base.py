"""The task base class and registry. Tasks reach participants as plain data:
``{"task": name, "params": {...}}``."""

from __future__ import annotations

from typing import Any, ClassVar

from experiment_design.errors import TracrError, UnknownNameError

_TASKS: dict[str, type[Task]] = {}


class Task:
    """One step of a participant's playbook, run in the participant's task thread.

    ``run(participant)`` gets the role instance (a ParticipantService) and may
    use its model, inputs and partners; it reports progress with
    ``participant.progress(done=, total=, split=)``.

    Example::

        from experiment_design.tasks import Task, register_task

        @register_task("infer-first-split")
        class InferFirstSplit(Task):
            '''Run every input once at the first valid split.'''

            def run(self, participant):
                k = participant.split_model.valid_splits()[0]
                participant.progress(done=0, total=len(participant.inputs), split=k)
                for i, (x, label, item) in enumerate(participant.inputs):
                    participant.infer(x, label, item, k)
                    participant.progress(done=i + 1)
    """

    name: ClassVar[str] = ""
    #: role capability the task needs (an attribute of the participant), checked before running
    requires: ClassVar[str | None] = None

    def __init__(self, **params: Any) -> None:
        self.params = dict(params)

    def check(self, participant: Any) -> None:
        """Refuse to run on a role that lacks what this task needs."""
        if self.requires and not hasattr(participant, self.requires):
            raise TracrError(
                f"Task '{self.name}' cannot run on role '{participant.role_name}' "
                f"(it needs a role with '{self.requires}', e.g. edge)."
            )

    def run(self, participant: Any) -> None:
        """Do the work; raise to fail the task (the error reaches the observer)."""
        raise NotImplementedError


def register_task(name: str | None = None):
    """Class decorator: register a :class:`Task` subclass under ``name``."""

    def deco(cls: type[Task]) -> type[Task]:
        key = name or cls.__dict__.get("name") or cls.__name__.lower()
        cls.name = key
        _TASKS[key] = cls
        return cls

    return deco


def _discover() -> None:
    from experiment_design.runtime.discovery import import_submodules

    import_submodules("experiment_design.tasks")


def get_task(name: str) -> type[Task]:
    """The class registered as ``name``."""
    _discover()
    if name not in _TASKS:
        raise UnknownNameError("task", name, _TASKS)
    return _TASKS[name]


def create_task(name: str, **params: Any) -> Task:
    """Instantiate the task ``name`` with ``params``."""
    cls = get_task(name)
    try:
        return cls(**params)
    except TypeError as exc:
        raise TracrError(f"Bad parameters for task '{name}': {exc}") from exc


def list_tasks() -> list[str]:
    """Registered task names, sorted."""
    _discover()
    return sorted(_TASKS)
