"""The run planner: a manifest and its overrides become frozen, printable planned runs."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from app_api.manifest import load_manifest, parse_overrides
from app_api.runner.facts import LabFacts
from app_api.runner.plan import PLAIN, SHAPED, SWEEP, plan_runs

LOCAL = ["participant_instances.edge-1.device=localhost",
         "participant_instances.cloud-1.device=localhost"]


def _manifest(*overrides: str, name: str = "neurosurgeon-alexnet"):
    return load_manifest(name, parse_overrides([*LOCAL, *overrides]))


def test_plain_run():
    plan = plan_runs(_manifest("network.bandwidths=null", "network.bandwidth=null"))
    assert plan.kind == PLAIN and len(plan.runs) == 1 and plan.bandwidths == []
    assert plan.runs[0].bandwidth is None and plan.runs[0].subdir is None


def test_a_bandwidth_on_the_command_line_is_one_shaped_run():
    plan = plan_runs(_manifest("network.bandwidth=16MB/s"))
    assert plan.kind == SHAPED and plan.bandwidths == ["16MB/s"]
    assert "shaped to 16MB/s" in str(plan)


def test_a_sweep_derives_one_manifest_per_rate_without_reading_the_file(tmp_path):
    src = tmp_path / "sweep.yaml"
    shutil.copy(load_manifest("neurosurgeon-alexnet", LOCAL).path, src)
    m = load_manifest(str(src), parse_overrides([*LOCAL, "run.warmup=1"]))
    src.unlink()  # the planner must not go back to the file
    plan = plan_runs(m)
    assert plan.kind == SWEEP and plan.bandwidths == ["1MB/s", "4MB/s", "16MB/s", "64MB/s"]
    assert [r.subdir for r in plan.runs] == ["bw-1MBps", "bw-4MBps", "bw-16MBps", "bw-64MBps"]
    for run in plan.runs:
        assert run.manifest.network["bandwidth"] == run.bandwidth
        assert run.manifest.network["bandwidths"] is None
        assert run.manifest.run["warmup"] == 1
        assert run.manifest.overrides == [*LOCAL, "run.warmup=1",
                                          f"network.bandwidth={run.bandwidth}",
                                          "network.bandwidths=null"]
    assert m.network["bandwidths"] == plan.bandwidths  # the loaded manifest is unchanged
    text = str(plan)
    assert text.startswith("sweep plan for sweep (--set ") and "-> bw-64MBps/" in text


def test_plans_are_frozen():
    plan = plan_runs(_manifest("network.bandwidth=4MB/s"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.kind = PLAIN  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.runs[0].bandwidth = "1MB/s"  # type: ignore[misc]


def test_lab_facts_are_plain_frozen_data():
    facts = LabFacts(link={"bandwidth_Bps": 4e6}, cpu_quotas={"lab-1": {"fraction": 0.5}})
    assert facts.cpu_quota("lab-1") == {"fraction": 0.5} and facts.cpu_quota("lab-2") is None
    assert facts.link_report() == {"bandwidth_Bps": 4e6}
    assert LabFacts().link_report() is None and LabFacts().cpu_quota("lab-1") is None


def test_the_observer_does_not_import_the_lab():
    import ast
    from pathlib import Path

    import app_api.runner.observer as observer

    tree = ast.parse(Path(observer.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n == "app_api.lab" or n.startswith("app_api.lab.")]


def _killed_run(tmp_path, m, splits: list[int], errors=()) -> Path:
    from app_api.results import RunWriter

    w = RunWriter(m.name, out_dir=tmp_path / "killed")
    w.write_text("manifest.yaml", m.to_yaml())
    w.add_inferences([{"inference": i, "split": k, "instance": "edge-1", "e2e_ms": 1.0,
                       "error": "boom" if i in errors else ""} for i, k in enumerate(splits)])
    w.close()
    return w.dir


def test_resume_hands_the_counts_to_cyclic_and_runs_one_pass_of_what_is_left(tmp_path):
    from app_api.runner.plan import plan_resume

    m = _manifest("network.bandwidths=null", "run.repeats=2", name="alexnet-sweep")
    src = _killed_run(tmp_path, m, [0, 0, 1, 1, 2], errors={4})
    plan = plan_resume(m, src)
    assert plan.kind == PLAIN and plan.runs[0].resume_from == src and "resuming" in str(plan)
    r = plan.runs[0].manifest
    assert r.partitioner["params"]["done"] == {0: 2, 1: 2}  # the failed row is redone
    assert r.partitioner["params"]["passes"] == 2
    assert r.playbook["edge-1"][0]["params"]["sweeps"] == 1
    assert r.overrides == m.overrides  # the user's own, so a resumed run can be resumed


def test_resume_shortens_an_explicit_count(tmp_path):
    from app_api.runner.plan import plan_resume

    m = _manifest("network.bandwidths=null", "partitioner.name=fixed",
                  "+playbook.edge-1.0.params.count=5", name="alexnet-sweep")
    plan = plan_resume(m, _killed_run(tmp_path, m, [3, 3]))
    assert plan.runs[0].manifest.playbook["edge-1"][0]["params"]["count"] == 3


def test_resume_refusals(tmp_path):
    from app_api.runner.plan import plan_resume
    from experiment_design.errors import TracrError

    m = _manifest("network.bandwidths=null", name="alexnet-sweep")
    with pytest.raises(TracrError, match="different model"):
        plan_resume(_manifest("network.bandwidths=null", "model.batch=2", name="alexnet-sweep"),
                    _killed_run(tmp_path, m, [0]))
    fixed = _manifest("network.bandwidths=null", "partitioner.name=fixed", name="alexnet-sweep")
    with pytest.raises(TracrError, match="params.count"):
        plan_resume(fixed, _killed_run(tmp_path / "b", fixed, [0]))
    with pytest.raises(TracrError, match="manifest.yaml"):
        plan_resume(m, tmp_path)


def test_loss_jitter_and_a_trace_are_shaped_by_the_run():
    # before, network.loss_pct and jitter_ms were refused ("the lab shapes only bandwidth
    # and delay_ms") and a trace could not be asked for by a manifest at all
    plan = plan_runs(_manifest("network.bandwidth=16Mbit", "network.loss_pct=1",
                               "network.jitter_ms=2", "network.delay_ms=20",
                               "network.trace=walk"))
    run = plan.runs[0]
    assert plan.kind == SHAPED and run.bandwidth == "16Mbit" and run.delay_ms == 20
    assert run.link == {"loss": "1%", "jitter": 2.0, "trace": "walk"}
    # a sweep carries them to every rate
    plan = plan_runs(_manifest("network.loss_pct=0.5"))
    assert plan.kind == SWEEP and all(r.link == {"loss": "0.5%"} for r in plan.runs)
    # loss alone (no rate): one shaped run that keeps the lab's rate
    plan = plan_runs(_manifest("network.bandwidths=null", "network.bandwidth=null",
                               "network.loss_pct=2"))
    assert plan.kind == SHAPED and plan.runs[0].bandwidth is None
    assert plan.runs[0].link == {"loss": "2%"}
