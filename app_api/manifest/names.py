"""The names a manifest may use, asked of each registry.

Roles, tasks, partitioners and models come from ``experiment_design``'s
registries, datasets from the dataset registry, devices from the device
registry (paired devices plus the built-in ``localhost``). A ``torchvision:``
model is checked against torchvision only when a manifest names one, so
validating a manifest does not load torchvision otherwise.
"""

from __future__ import annotations

# The dataset registry moves to experiment_design.datasets; switching is this one line.
import experiment_design.datasets as dataset_registry
from app_api.devices.registry import LOCALHOST, DeviceRegistry
from experiment_design.constants import TORCHVISION_PREFIX
from experiment_design.models import list_models
from experiment_design.models.llm import list_llms
from experiment_design.params import problems
from experiment_design.partitioners import get_partitioner, list_partitioners
from experiment_design.roles import list_roles
from experiment_design.tasks import list_tasks

__all__ = [
    "LOCALHOST",
    "TORCHVISION_PREFIX",
    "dataset_params",
    "dataset_required_params",
    "datasets",
    "devices",
    "models",
    "partitioners",
    "roles",
    "tasks",
    "torchvision_models",
]


def roles() -> list[str]:
    """Registered participant roles."""
    return list(list_roles())


def tasks() -> list[str]:
    """Registered tasks."""
    return list(list_tasks())


def partitioners() -> list[str]:
    """Registered partitioners."""
    return list(list_partitioners())


def datasets() -> list[str]:
    """Registered datasets (built-ins plus modules in MyDatasets/)."""
    return list(dataset_registry.list_datasets())


def param_problems(kind: str, name: str, given: dict) -> list[tuple[str, str]]:
    """``(param, problem)`` for each of ``given`` that partitioner or dataset ``name``'s
    declared parameters refuse (:mod:`experiment_design.params`)."""
    cls = get_partitioner(name) if kind == "partitioner" else dataset_registry.get_dataset_class(
        name)
    return problems(cls, given)


def dataset_params(name: str) -> list[str] | None:
    """Parameters dataset ``name`` accepts, or None for any."""
    return dataset_registry.accepted_params(name)


def dataset_required_params(name: str) -> list[str]:
    """Parameters dataset ``name`` cannot do without."""
    return list(dataset_registry.required_params(name))


def models() -> list[str]:
    """Registered model names, the language models' included (``torchvision:<name>`` is
    checked separately)."""
    return [*list_models(), *list_llms()]


def torchvision_models() -> list[str] | None:
    """Classification model names torchvision knows, or None without torchvision.

    Imported here, and only when a manifest names a ``torchvision:`` model:
    torchvision loads torch, which validating any other manifest does without.
    """
    try:
        import torchvision.models as tvm
    except ModuleNotFoundError:  # torchvision is optional on the observer
        return None
    return list(tvm.list_models(module=tvm))


def devices() -> list[str]:
    """Paired device names plus ``localhost``."""
    return sorted(set(DeviceRegistry.load().names()) | {LOCALHOST})
