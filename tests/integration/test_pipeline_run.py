"""Chains of three real participants on this machine: routes, pipelining, long skips, faults."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.helpers import live_processes

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def run(name: str, overrides: list[str], out: Path):
    from app_api.manifest import load_manifest
    from app_api.runner import run_experiment

    return run_experiment(load_manifest(name, overrides), out_dir=out, progress=False)


def by_item(rows: list[dict]) -> dict[str, set[float]]:
    out: dict[str, set[float]] = {}
    for r in rows:
        out.setdefault(r["item"], set()).add(round(float(r["output_sum"]), 3))
    return out


@pytest.mark.slow
def test_every_cut_pair_of_a_three_stage_chain_gives_the_unsplit_output(tmp_path):
    from app_api.results import read_configs, read_csv

    # exhaustive: every valid cut pair of alexnet's 7 block boundaries over edge -> stage -> cloud
    res = run("alexnet-pipeline", [
        "partitioner.name=exhaustive", "model.depth=2", "pipeline.count=2",
        "pipeline.modes=[latency]", "pipeline.baselines=false", "dataset.params.limit=2",
    ], tmp_path / "run")
    assert res.ok, res.errors
    configs = read_configs(res.run_dir)
    n_pairs = len({c["config"] for c in configs})
    assert n_pairs >= 15 and all(c["chain"] == ["edge-1", "stage-1", "cloud-1"] for c in configs)
    rows = read_csv(res.run_dir / "inferences.csv")
    assert not [r for r in rows if r["error"]]
    # each input gives the same output whatever the cuts (the model split exactly)
    assert all(len(v) == 1 for v in by_item(rows).values()), by_item(rows)
    stages = read_csv(res.run_dir / "stages.csv")
    assert {r["hop"] for r in stages} == {"0", "1", "2"}
    for r in (r for r in stages if r["hop"] == "1"):
        assert int(r["first"]) <= int(r["last"]) + 1
    # each sender's hand-off (latency mode: compute and send on one thread) carries its
    # thread's run-queue wait as the kernel counts it, for the latency budget
    senders = [r for r in stages if r["hop"] in ("0", "1")]
    assert senders and all(float(r["cpu_wait_ms"]) >= 0 for r in senders)
    assert "cpu_wait_ms" in res.summary["latency_budget"]["parts_ms_median"]
    # each layer row names the stage that ran it (before: the head, edge-1, for all of them)
    names = {"edge": "edge-1", "stage1": "stage-1", "cloud": "cloud-1"}
    layers = read_csv(res.run_dir / "layers.csv")
    assert {r["instance"] for r in layers} == {"edge-1", "stage-1", "cloud-1"}
    assert all(r["instance"] == names[r["side"]] for r in layers)


@pytest.mark.slow
def test_long_skip_connections_are_forwarded_through_a_middle_stage(tmp_path):
    from app_api.results import read_csv
    from experiment_design.split import build_split_model

    # resnet18, both cuts inside one residual block: the block's input skips the middle stage
    sm = build_split_model("resnet18")
    pairs = [(a, b) for a in sm.valid_splits() for b in sm.valid_splits()
             if 0 < a < b < sm.n and sm.passthrough(a, b)]
    a, b = pairs[len(pairs) // 2]
    res = run("alexnet-pipeline", [
        "model.name=resnet18", "partitioner.name=exhaustive",
        f"+partitioner.params.splits=[{a},{b}]", "pipeline.count=3",
        "pipeline.modes=[latency,throughput]", "pipeline.baselines=true", "dataset.params.limit=1",
    ], tmp_path / "run")
    assert res.ok, res.errors
    stages = [r for r in read_csv(res.run_dir / "stages.csv") if r["config"] == f"{a}/{b}"]
    middle = [r for r in stages if r["hop"] == "1"]
    assert middle and all(int(r["forwarded_bytes"]) > 0 for r in middle)
    rows = read_csv(res.run_dir / "inferences.csv")
    assert all(len(v) == 1 for v in by_item(rows).values())


@pytest.mark.slow
def test_throughput_mode_keeps_several_inferences_in_flight(tmp_path):
    from app_api.results import read_csv

    res = run("alexnet-pipeline", ["pipeline.count=16", "pipeline.in_flight=3",
                                   "dataset.params.limit=2"], tmp_path / "run")
    assert res.ok, res.errors
    s = res.summary
    assert s["throughput_per_s"] > 0 and s["bound_per_s"] > 0
    assert len(s["stages"]) == len(s["pipeline"]["chosen"]["chain"])
    for key in ("throughput_over_bound", "pipelined_over_sequential", "pipelined_over_single"):
        assert s["pipeline"]["ratios"][key] is not None
    rows = [r for r in read_csv(res.run_dir / "stages.csv") if r["mode"] == "throughput"]
    # there the send thread is another than the compute's: its wait is queue, not CPU wait
    assert rows and all(r["cpu_wait_ms"] == "" for r in rows)
    # some inference started on the head before the one before it had left the last stage
    by_inf: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_inf.setdefault(r["inference"], {})[r["hop"]] = r
    ids = sorted(by_inf, key=int)
    last_hop = max(by_inf[ids[0]], key=int)
    overlaps = sum(float(by_inf[j]["0"]["t_start_ms"]) < float(by_inf[i][last_hop]["t_end_ms"])
                   for i, j in zip(ids, ids[1:], strict=False))
    assert overlaps >= len(ids) // 2
    assert (res.run_dir / "plots" / "timeline.png").exists()


@pytest.mark.slow
def test_a_stopped_middle_stage_ends_the_pipeline_within_the_liveness_timeout(tmp_path):
    me = psutil.Process()
    stopped: list[int] = []

    def stop_the_middle() -> None:  # SIGSTOP stage-1 once the chain is measuring
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if (tmp_path / "run" / "stages.csv").exists():
                for p in live_processes(me, "--instance stage-1"):
                    os.kill(p.pid, signal.SIGSTOP)
                    stopped.append(p.pid)
                    return
            time.sleep(0.05)

    t = threading.Thread(target=stop_the_middle, daemon=True)
    t.start()
    t0 = time.monotonic()
    try:
        res = run("alexnet-pipeline", ["pipeline.count=400", "pipeline.baselines=false",
                                       "run.liveness_timeout_s=5"], tmp_path / "run")
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    took = time.monotonic() - t0
    assert stopped, "the middle stage was never stopped"
    assert not res.ok and res.exit_code == 1
    assert took < 90, took
    assert any("stage-1" in e for e in res.errors), res.errors
    assert not live_processes(me, "experiment_design.participant")


@pytest.mark.slow
def test_bench_pipeline_local_runs_without_a_lab(tmp_path):
    """`tracr bench pipeline --local` on a machine with no lab (before: exit 2, "Unknown
    device 'lab-1'", from validating the manifest before moving it to localhost)."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "app", "bench", "pipeline", "--local", "--json",
         "--set", "pipeline.count=8", "--set", "dataset.params.limit=2"],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "ok" and out["lab_cpu"] is None
    assert len(out["stages"]) >= 1 and out["throughput_per_s"] > 0
    for key in ("throughput_over_bound", "pipelined_over_sequential", "pipelined_over_single"):
        assert out[key] > 0, key


@pytest.mark.slow
def test_pipeline_dp_counts_what_each_stage_spends_beside_its_layers(tmp_path):
    """The start-up profile times layers only; a stage also receives, sends, relays the
    reply and hands work between its threads. pipeline-dp measures that on the chain
    itself and adds it to each stage of a plan, and the run keeps the profiles it planned
    from (``profiles.json``)."""
    import json

    res = run("alexnet-pipeline", ["pipeline.count=8", "pipeline.modes=[throughput]",
                                   "pipeline.baselines=false", "dataset.params.limit=2"],
              tmp_path / "run")
    assert res.ok, res.errors
    decision = res.summary["partitioner"]["edge-1"]["decision"]
    # a chain stage on this machine spends ~0.6-1 ms of CPU per inference beside its
    # layers, fitted across two probe routes as a fixed part per member (none a whole
    # pass; it may be 0 where the bytes explain it all)...
    assert set(decision["overhead_ms"]) == {"edge-1", "stage-1", "cloud-1"}
    assert all(0 <= ms < 20 for ms in decision["overhead_ms"].values()), decision
    # ...and a cost per byte a stage receives or sends
    assert all(0 < ms < 1e-4 for ms in decision["byte_ms"].values()), decision
    links = res.summary["links"]
    assert all(fig["send_ns_per_byte"] > 0 and fig["recv_ns_per_byte"] > 0
               for fig in links.values()), links
    placement = decision["placement"]
    overhead = placement["overhead_ms"]
    assert len(overhead) == len(placement["stages"])
    if len(placement["stages"]) > 1:
        assert all(ms > 0 for ms in overhead), overhead
        # with passes in flight a stage sends while it computes the next one
        stage_ms = [max(c + o, t) for c, o, t in zip(placement["compute_ms"], overhead,
                                                     placement["transfer_ms"], strict=True)]
        assert max(stage_ms) == pytest.approx(placement["bottleneck_ms"])
    # the run that measures the plan carries the plan's figures per stage beside what each
    # stage measured, so a reader sees which stage the prediction missed
    run_cfg = next(c for c in res.summary["pipeline"]["configs"]
                   if c["cuts"] == placement["cuts"] and c["mode"] == "throughput")
    assert len(run_cfg["stages"]) == len(placement["stages"])
    for st, c, o in zip(run_cfg["stages"], placement["compute_ms"], overhead, strict=True):
        assert st["predicted_compute_ms"] == pytest.approx(c)
        assert st["predicted_overhead_ms"] == pytest.approx(o)
        assert 0 < st["cpu_ms"] <= st["compute_ms"] * 1.5
    assert max(st["predicted_stage_ms"] for st in run_cfg["stages"]) == pytest.approx(
        placement["bottleneck_ms"])
    profiles = json.loads((res.run_dir / "profiles.json").read_text())
    assert set(profiles) == {"edge-1", "stage-1", "cloud-1"}
    assert all(p["layers"] and p["full_ms"] > 0 for p in profiles.values())


# Loaded by every python started with it on PYTHONPATH; acts only in the head's process:
# EdgeRole.run_config waits TRACR_TEST_IDLE_S before every configuration but the first,
# as a head planning or busy with its own work between two configurations would.
IDLE_SITE = r'''
import importlib.machinery, os, sys, time

class _IdleBetweenConfigs:
    def find_spec(self, name, path=None, target=None):
        if name != "experiment_design.roles.edge":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            measure = module.EdgeRole.run_config
            calls = [0]

            def run_config(self, *args, **kw):
                calls[0] += 1
                if calls[0] > 1:
                    time.sleep(float(os.environ["TRACR_TEST_IDLE_S"]))
                return measure(self, *args, **kw)

            module.EdgeRole.run_config = run_config
        spec.loader.exec_module = exec_module
        return spec

if "--role" in sys.argv and sys.argv[sys.argv.index("--role") + 1] == "edge":
    sys.meta_path.insert(0, _IdleBetweenConfigs())
'''


@pytest.mark.slow
def test_a_chain_idle_longer_than_the_liveness_timeout_goes_on(tmp_path, monkeypatch):
    """Between two configurations the head does not send for 6 s, twice the liveness
    timeout. A middle stage's relay thread read its downstream channel all the time,
    under the liveness deadline, so the idle gap closed the link and every later
    inference along the route failed; a link's deadline now runs only while a partner
    owes a reply."""
    from app_api.results import read_configs, read_csv

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(IDLE_SITE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(REPO), str(site), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("TRACR_TEST_IDLE_S", "6")
    res = run("alexnet-pipeline", ["pipeline.count=4", "pipeline.modes=[throughput,latency]",
                                   "pipeline.baselines=false", "dataset.params.limit=2",
                                   "partitioner.name=exhaustive", "+partitioner.params.splits=[4]",
                                   "run.liveness_timeout_s=3"], tmp_path / "run")
    assert res.ok, res.errors
    configs = read_configs(res.run_dir)
    assert {c["mode"] for c in configs} == {"throughput", "latency"}
    assert all(c["chain"] == ["edge-1", "stage-1", "cloud-1"] for c in configs), configs
    rows = read_csv(res.run_dir / "inferences.csv")
    assert len(rows) == 4 * len(configs) and not [r for r in rows if r["error"]]


@pytest.mark.slow
def test_a_solo_pass_longer_than_the_liveness_timeout_ends_ok(tmp_path):
    """A partner's single-device baseline (``solo``) sent its only reply after all its
    passes, so one busy for longer than the liveness timeout was declared lost; it now
    reports its progress between passes, and only a pass longer than the timeout is."""
    from app_api.results import read_configs

    count, liveness = 200, 3
    res = run("alexnet-pipeline", [f"pipeline.count={count}", "pipeline.modes=[latency]",
                                   "pipeline.baselines=true", "dataset.params.limit=2",
                                   "partitioner.name=exhaustive", "+partitioner.params.splits=[4]",
                                   f"run.liveness_timeout_s={liveness}"], tmp_path / "run")
    assert res.ok, res.errors
    singles = {c["chain"][0]: c for c in read_configs(res.run_dir) if c["mode"] == "single"}
    assert set(singles) == {"edge-1", "stage-1", "cloud-1"}
    for name, c in singles.items():
        # the pass really outlasted the timeout (else this test would prove nothing)
        assert count / float(c["throughput_per_s"]) > liveness, (name, c)
