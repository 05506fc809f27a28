"""Memory caps of lab hosts (app_api.lab.memory): sizes and caps read and checked, a
host's cap recorded in the lab state and released (the cgroup calls faked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app_api.lab import memory
from experiment_design.errors import TracrError


def test_sizes_read_in_decimal_and_binary_units():
    assert memory.parse_size("600MB") == 600_000_000
    assert memory.parse_size("1.5GB") == 1_500_000_000
    assert memory.parse_size("512MiB") == 512 * 2**20
    assert memory.parse_size("2g") == 2 * 10**9
    assert memory.parse_size(123456789) == 123456789
    with pytest.raises(TracrError, match="cannot read the memory size '600 parsecs'"):
        memory.parse_size("600 parsecs")


def test_caps_name_lab_hosts_and_leave_room_for_sshd():
    assert memory.parse_limits(["lab-1=600MB", "lab-3=1GB"], 3) == {
        "lab-1": 600_000_000, "lab-3": 1_000_000_000}
    assert memory.parse_limits({"lab-2": "700MB"}, 2) == {"lab-2": 700_000_000}
    assert memory.parse_limits(None, 2) == {}
    with pytest.raises(TracrError, match="no lab host 'lab-4'") as e:
        memory.parse_limits(["lab-4=1GB"], 3)
    assert "lab-1, lab-2, lab-3" in e.value.hint
    with pytest.raises(TracrError, match="below 16 MiB"):
        memory.parse_limits(["lab-1=1MB"], 1)
    with pytest.raises(TracrError, match="cannot read the memory cap 'lab-1'"):
        memory.parse_limits(["lab-1"], 1)


def test_apply_caps_each_named_host_and_release_removes_its_cgroup(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "base", lambda: tmp_path)
    moved = []
    monkeypatch.setattr(memory, "add_pid", lambda path, pid: moved.append((path.name, pid)))
    state = {"hosts": [{"name": "lab-1", "ns": "tracr-lab-1", "sshd_pid": 41},
                       {"name": "lab-2", "ns": "tracr-lab-2", "sshd_pid": 42}]}
    said = []
    memory.apply(state, {"lab-2": 600_000_000}, said.append)
    lab1, lab2 = state["hosts"]
    assert "memory_cgroup" not in lab1 and lab2["memory_bytes"] == 600_000_000
    path = Path(lab2["memory_cgroup"])
    assert (path / "memory.limit_in_bytes").read_text() == "600000000"
    assert moved == [("tracr-lab-2", 42)] and said == ["lab-2: memory capped at 600 MB"]
    for f in path.iterdir():  # a real cgroup directory empties itself
        f.unlink()
    assert memory.release(state) == [str(path)] and not path.exists()


def test_a_manifest_states_memory_caps_and_a_lab_without_them_differs():
    from app_api.lab.requirement import LabSpec, differences, stated_lab, up_command

    name, lab, network = stated_lab("llm-placement-lab")
    spec = LabSpec.from_section(lab)
    assert spec.memory == {f"lab-{i}": "1600MB" for i in (1, 2, 3)}
    assert "--memory lab-1=1600MB lab-2=1600MB lab-3=1600MB" in up_command(spec, network)
    assert spec.up_kwargs(network)["memory"]["lab-3"] == "1600MB"
    hosts = [{"name": f"lab-{i}", "cpu_quota": q, "cpu_mode": "quota"}
             for i, q in ((1, 0.6), (2, 0.6), (3, 0.15))]
    state = {"hosts": hosts, "pinned": False}
    diffs = differences(spec, state)
    assert {"what": "lab-2 memory", "wanted": "1600 MB", "found": "uncapped"} in diffs
    for h in hosts:
        h["memory_bytes"] = 1_600_000_000
    assert not [d for d in differences(spec, state) if "memory" in d["what"]]


def test_the_schema_checks_the_hosts_and_sizes_of_lab_memory():
    from app_api.manifest.schema import _lab_check

    assert _lab_check({"hosts": 2, "memory": {"lab-1": "600MB"}}) is None
    assert "lab.memory names 'lab-3'" in _lab_check({"hosts": 2, "memory": {"lab-3": "1GB"}})
    assert "cannot read the memory size" in _lab_check({"hosts": 2,
                                                        "memory": {"lab-1": "lots"}})
