"""Role and task registries, role matching by subclass, and user modules dropped in."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from experiment_design.errors import TracrError, UnknownNameError
from experiment_design.roles import ParticipantService, get_role, list_roles, role_is
from experiment_design.tasks import Task, create_task, get_task, list_tasks


def test_builtin_roles_and_partners():
    assert {"edge", "cloud"} <= set(list_roles())
    edge = get_role("edge")
    assert issubclass(edge, ParticipantService)
    assert edge.partners == {"downstream": "cloud"}
    with pytest.raises(UnknownNameError, match="edge"):
        get_role("edgy")


def test_builtin_tasks():
    assert {"infer-dataset", "infer-one", "wait", "finish"} <= set(list_tasks())
    t = create_task("infer-dataset", count=3)
    assert isinstance(t, Task) and t.params == {"count": 3}
    with pytest.raises(UnknownNameError):
        get_task("infer-datasets")


def test_task_refuses_role_without_capability():
    class Bare:
        role_name = "bare"

    with pytest.raises(TracrError, match="cannot run on role 'bare'"):
        create_task("infer-dataset").check(Bare())


def test_only_exposed_members_are_rpc_visible():
    exposed = {n for n in dir(get_role("cloud")) if n.startswith("exposed_")}
    assert {
        "exposed_hello",
        "exposed_setup",
        "exposed_poll",
        "exposed_start_task",
        "exposed_shutdown",
        "exposed_heartbeat",
        "exposed_data_address",
        "exposed_connect_partners",
        "exposed_profile_layers",
        "exposed_probe_link",
        "exposed_warmup",
    } <= exposed


def _drop_module(package: str, body: str):
    import importlib

    pkg = importlib.import_module(package)
    mod = f"usertest_{uuid.uuid4().hex[:8]}"
    path = Path(pkg.__file__).parent / f"{mod}.py"
    path.write_text(body.replace("NAME", mod))
    return mod, path


def test_user_role_subclass_is_discovered_and_matches_its_base_role():
    mod, path = _drop_module(
        "experiment_design.roles",
        "from experiment_design.roles import register_role\n"
        "from experiment_design.roles.cloud import CloudRole\n"
        "@register_role('NAME')\n"
        "class GpuCloud(CloudRole):\n"
        "    '''A cloud that could use a GPU.'''\n",
    )
    try:
        assert mod in list_roles()
        assert role_is(get_role(mod), "cloud")
        assert not role_is(get_role(mod), "edge")
    finally:
        path.unlink()
        sys.modules.pop(f"experiment_design.roles.{mod}", None)


def test_user_task_is_discovered():
    mod, path = _drop_module(
        "experiment_design.tasks",
        "from experiment_design.tasks import Task, register_task\n"
        "@register_task('NAME')\n"
        "class Hello(Task):\n"
        "    '''Does nothing.'''\n"
        "    def run(self, participant):\n"
        "        participant.progress(done=1, total=1)\n",
    )
    try:
        assert mod in list_tasks()
        assert create_task(mod, x=1).params == {"x": 1}
    finally:
        path.unlink()
        sys.modules.pop(f"experiment_design.tasks.{mod}", None)


def test_every_extension_point_is_one_registry():
    from experiment_design.datasets import DATASETS
    from experiment_design.models import MODELS
    from experiment_design.partitioners import PARTITIONERS
    from experiment_design.registry import Registry
    from experiment_design.roles.registry import ROLES
    from experiment_design.tasks import TASKS

    regs = [ROLES, TASKS, PARTITIONERS, MODELS, DATASETS]
    assert all(isinstance(r, Registry) for r in regs)
    assert [r.kind for r in regs] == ["role", "task", "partitioner", "model", "dataset"]


def test_registry_rules_duplicates_base_and_pattern():
    from experiment_design.registry import Registry

    class Base:
        name = ""

    reg = Registry("widget", base=Base)

    @reg.register()
    class Small(Base):
        pass

    @reg.register("big-one")
    class Big(Base):
        pass

    assert Small.name == "small" and Big.name == "big-one"
    assert reg.names("big*") == ["big-one"]
    reg.add("small", Small)  # the same class again (a re-imported module) replaces it
    with pytest.raises(TracrError, match="registered twice"):
        reg.add("small", Big)
    with pytest.raises(TypeError, match="Base subclass"):
        reg.add("other", object)
    with pytest.raises(UnknownNameError, match="Did you mean 'small'"):
        reg.get("smal")
    with pytest.raises(TracrError, match="Bad parameters for widget 'small'"):
        reg.create("small", size=1)


def test_broken_module_in_a_registry_package_is_a_clear_error():
    mod, path = _drop_module("experiment_design.tasks", "import not_a_real_module_xyz\n")
    try:
        with pytest.raises(TracrError, match=f"Could not import task module .*{mod}") as info:
            list_tasks()
        assert mod in info.value.hint
    finally:
        path.unlink()
        sys.modules.pop(f"experiment_design.tasks.{mod}", None)
    assert "wait" in list_tasks()
