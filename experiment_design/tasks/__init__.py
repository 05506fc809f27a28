"""Tasks: the steps of a participant's playbook (users subclass :class:`Task`).

Built-ins: ``infer-dataset``, ``infer-one``, ``wait``, ``finish``. Every module
in this package is imported on first registry use.
"""

from __future__ import annotations

from experiment_design.tasks.base import (
    TASKS,
    Task,
    create_task,
    get_task,
    list_tasks,
    register_task,
)

__all__ = ["TASKS", "Task", "create_task", "get_task", "list_tasks", "register_task"]
