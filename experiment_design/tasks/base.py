"""The task base class and its registry. Tasks reach participants as plain data:
``{"task": name, "params": {...}}``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from experiment_design.errors import TracrError
from experiment_design.registry import Registry


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


#: name -> Task subclass; every module of ``experiment_design.tasks`` is imported on lookup.
TASKS: Registry[type[Task]] = Registry("task", ["experiment_design.tasks"], base=Task)


def register_task(name: str | None = None) -> Callable[[type[Task]], type[Task]]:
    """Class decorator: register a :class:`Task` subclass under ``name``."""
    return TASKS.register(name)


def get_task(name: str) -> type[Task]:
    """The class registered as ``name``."""
    return TASKS.get(name)


def create_task(name: str, **params: Any) -> Task:
    """Instantiate the task ``name`` with ``params``."""
    return TASKS.create(name, **params)


def list_tasks() -> list[str]:
    """Registered task names, sorted."""
    return TASKS.names()
