"""The lab a manifest states (its ``lab`` section) against the lab that is up."""

from __future__ import annotations

import json

import pytest

import app
from app_api.lab import requirement, state
from app_api.lab.registry_link import register_hosts
from app_api.manifest import ManifestError, load_manifest
from app_api.runner import labcheck
from experiment_design.errors import TracrError


@pytest.fixture(autouse=True)
def lab_root(tmp_path, monkeypatch):
    """The lab's state directory and the device registry inside the test's own (no real lab
    is touched), with lab-1 and lab-2 paired as ``lab up`` pairs them."""
    monkeypatch.setenv("TRACR_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("TRACR_DEVICES", str(tmp_path / "devices.yaml"))
    monkeypatch.setattr(state, "LAB_ROOT", tmp_path / "lab", raising=False)
    register_hosts({"client_key": str(tmp_path / "key"), "python": "python3",
                    "known_hosts": str(tmp_path / "known_hosts"),
                    "hosts": [{"name": f"lab-{i}", "address": f"10.213.0.{i + 1}",
                               "ns": f"tracr-lab-{i}"} for i in (1, 2)]})
    return tmp_path / "lab"


def _lab(quotas: dict[str, float | None], mode: str = "duty", pinned: bool = True,
         period_us: int = 1000) -> dict:
    """Write a lab state as ``lab up`` records it: hosts, their quotas, mode and tick."""
    s = state.new_state()
    for name, share in quotas.items():
        h = state.host_entry(s, name)
        if share is not None:
            h.update(cpu_quota=share, cpu_mode=mode, cpu_period_us=period_us)
    s["pinned"] = pinned
    state.save_state(s)
    return s


def test_the_validation_manifests_state_the_paced_lab_they_were_measured_on():
    for name in ("neurosurgeon-alexnet", "neurosurgeon-mobilenet_v2", "neurosurgeon-resnet18",
                 "codec-sweep-lab"):
        m = load_manifest(name)
        spec = requirement.LabSpec.from_section(m.lab)
        assert spec == requirement.LabSpec(hosts=2, cpu={"lab-1": 0.25}, cpu_mode="duty")
        assert requirement.up_command(spec, m.network) == (
            "sudo tracr lab up --hosts 2 --bandwidth 4MB/s --cpu-quota lab-1=0.25 "
            "--cpu-mode duty")
    assert load_manifest("alexnet-sweep").lab is None


def test_the_stated_lab_has_no_differences(lab_root):
    spec = requirement.LabSpec(hosts=2, cpu={"lab-1": 0.25}, cpu_mode="duty")
    assert requirement.differences(spec, _lab({"lab-1": 0.25, "lab-2": None})) == []


def test_every_difference_is_named_with_both_figures(lab_root):
    spec = requirement.LabSpec(hosts=2, cpu={"lab-1": 0.25}, cpu_mode="duty", cpu_period_ms=1)
    # the documented-but-not-used case: the plain quota where the figures came from the pacer
    diffs = requirement.differences(spec, _lab({"lab-1": 0.25, "lab-2": None}, mode="quota",
                                               period_us=10_000))
    assert diffs == [
        {"what": "lab-1 cpu mode", "wanted": "duty", "found": "quota"},
        {"what": "lab-1 cpu period", "wanted": "1 ms", "found": "10 ms"},
    ]
    diffs = requirement.differences(spec, _lab({"lab-1": 0.5, "lab-2": 0.6, "lab-3": None}))
    assert {"what": "hosts", "wanted": 2, "found": 3} in diffs
    assert {"what": "lab-1 cpu", "wanted": "0.25 core", "found": "0.5 core"} in diffs
    assert {"what": "lab-2 cpu", "wanted": "unlimited", "found": "0.6 core"} in diffs
    assert requirement.differences(spec, None) == [{"what": "hosts", "wanted": 2, "found": 0}]
    diffs = requirement.differences(spec, _lab({"lab-1": 0.25, "lab-2": None}, pinned=False,
                                               period_us=1000))
    assert diffs == [{"what": "pinned", "wanted": True, "found": False}]


def test_a_run_on_another_lab_is_refused_before_any_device_is_touched(lab_root):
    _lab({"lab-1": 0.25, "lab-2": None}, mode="quota")
    m = load_manifest("neurosurgeon-alexnet")
    with pytest.raises(TracrError) as err:
        labcheck.check_lab(m)
    assert "lab-1 cpu mode: wanted duty, found quota" in err.value.message
    assert "--cpu-mode duty" in err.value.hint and "lab.on_mismatch=record" in err.value.hint
    assert err.value.exit_code == 2


def test_record_runs_on_another_lab_and_says_how_it_differed(lab_root):
    _lab({"lab-1": 0.5, "lab-2": None}, mode="quota")
    m = load_manifest("neurosurgeon-alexnet", ["lab.on_mismatch=record"])
    record = labcheck.check_lab(m)
    assert record["used"] and not record["ok"]
    assert record["differences"] == [{"what": "lab-1 cpu", "wanted": "0.25 core",
                                      "found": "0.5 core"}]
    json.dumps(record)  # it goes into summary.json as it is


def test_a_manifest_moved_off_the_lab_is_not_checked(lab_root):
    m = load_manifest("neurosurgeon-alexnet", [
        "participant_instances.edge-1.device=localhost",
        "participant_instances.cloud-1.device=localhost"])
    record = labcheck.check_lab(m)  # no lab is up, and none is needed
    assert record["used"] is False and record["ok"]


def test_a_lab_section_naming_a_host_the_lab_lacks_is_a_manifest_error():
    with pytest.raises(ManifestError) as err:
        load_manifest("neurosurgeon-alexnet", ["lab.cpu={lab-3: 0.5}"])
    assert "lab-3" in err.value.message and "lab-1, lab-2" in err.value.message
    with pytest.raises(ManifestError) as err:
        load_manifest("neurosurgeon-alexnet", ["lab.cpu_mode=dutty"])
    assert "Did you mean 'duty'" in err.value.message


def test_lab_up_manifest_refuses_flags_beside_it(capsys):
    code = app.main(["lab", "up", "--manifest", "neurosurgeon-alexnet", "--hosts", "3"])
    assert code == 2
    assert "--hosts cannot be given with it" in capsys.readouterr().err


def test_the_stated_lab_is_read_before_its_hosts_exist(tmp_path, monkeypatch):
    # tracr lab up --manifest: the manifest's devices (lab-1, lab-2) are not paired yet, so
    # the full manifest does not validate; its lab and network sections alone do
    monkeypatch.setenv("TRACR_DEVICES", str(tmp_path / "empty.yaml"))
    with pytest.raises(ManifestError):
        load_manifest("neurosurgeon-alexnet")
    name, section, network = requirement.stated_lab("neurosurgeon-alexnet")
    spec = requirement.LabSpec.from_section(section)
    assert name == "neurosurgeon-alexnet" and spec.cpu_mode == "duty"
    assert spec.up_kwargs({**network, "delay_ms": 20, "loss_pct": 1, "trace": "walk"}) == {
        "hosts": 2, "bandwidth": "4MB/s", "cpu_quota": {"lab-1": 0.25}, "cpu_period_ms": None,
        "cpu_mode": "duty", "pin": True, "delay_ms": 20.0, "loss": "1%", "trace": "walk"}


def test_a_lab_with_more_hosts_than_cpus_is_unpinned_as_stated(lab_root, monkeypatch):
    # mobilenet-pipeline states 3 hosts on a 2-CPU machine: lab up cannot pin them, and a
    # run on that very lab was refused with "pinned: wanted True, found False"
    monkeypatch.setattr(requirement, "machine_cpus", lambda: 2)
    spec = requirement.LabSpec(hosts=3, cpu={"lab-1": 0.6, "lab-2": 0.6, "lab-3": 0.6},
                               cpu_mode="duty", cpu_period_ms=2)
    state = _lab({"lab-1": 0.6, "lab-2": 0.6, "lab-3": 0.6}, pinned=False, period_us=2000)
    assert requirement.differences(spec, state) == []
    monkeypatch.setattr(requirement, "machine_cpus", lambda: 4)
    assert requirement.differences(spec, state) == [
        {"what": "pinned", "wanted": True, "found": False}]
