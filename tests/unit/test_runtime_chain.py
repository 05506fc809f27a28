"""Routes of a chain, the layers each stage runs, and what a configuration's records add up to."""

from __future__ import annotations

import pytest

from experiment_design.errors import TracrError
from experiment_design.runtime.chain import Completed, Route, run_range
from experiment_design.runtime.pipestats import stage_rows, summarize, throughput_per_s


def test_a_route_gives_each_stage_its_layers():
    r = Route(("edge", "mid", "cloud"), (5, 12))
    assert r.k == 3 and r.label == "5/12"
    assert [r.bounds(h, 20) for h in range(3)] == [(0, 5), (5, 12), (12, 20)]
    assert Route.from_header(r.to_header()) == r
    assert Route(("edge",), ()).label == "-" and Route(("edge",), ()).bounds(0, 20) == (0, 20)


@pytest.mark.parametrize("route, cuts", [
    (("a", "b"), ()), (("a", "b"), (1, 2)), (("a", "b", "c"), (7, 3)), (("a", "a"), (3,)),
])
def test_a_malformed_route_is_refused(route, cuts):
    with pytest.raises(TracrError):
        Route(route, cuts)


def test_each_stage_of_a_three_stage_chain_runs_only_its_layers():
    import torch

    from experiment_design.split import build_split_model

    sm = build_split_model("alexnet")
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    ref, _ = sm.run_full(x)
    valid = sm.valid_splits()
    a, b = valid[3], valid[-5]
    first, t1 = run_range(sm, 0, a, {sm.points[0].crossing[0]: x}, timed=True, last=False)
    mid, t2 = run_range(sm, a, b, first, timed=True, last=False)
    out, t3 = run_range(sm, b, sm.n, mid, timed=True, last=True)
    assert torch.allclose(out, ref, atol=1e-5)
    assert [i for i, _ in t1 + t2 + t3] == list(range(1, sm.n + 1))
    with pytest.raises(TracrError, match="last stage"):
        run_range(sm, a, b, first, timed=False, last=True)
    with pytest.raises(TracrError, match="middle stage"):
        run_range(sm, a, sm.n, first, timed=False, last=False)


def _done(iid, route, t0, starts, ends, done_at, sent=1000):
    """A completed inference: stage h computed from starts[h] to ends[h] (ms)."""
    recs = [{"instance": name, "hop": h, "a": 0, "b": 0, "t_start": int(starts[h] * 1e6),
             "t_end": int(ends[h] * 1e6), "compute_ms": ends[h] - starts[h], "queue": 0,
             "bytes_encoded": sent, "send_ms": 0.5} for h, name in enumerate(route.route)]
    c = Completed(iid, route, recs[0], t_done=int(done_at * 1e6),
                  reply={"stages": recs[1:]})
    return c


def test_a_configuration_summary_adds_up():
    route = Route(("e", "m", "c"), (3, 9))
    # a 3-stage pipeline with 10 ms per stage: one result every 10 ms once it is full
    done = [_done(i, route, 10 * i, [10 * i, 10 * i + 10, 10 * i + 20],
                  [10 * i + 10, 10 * i + 20, 10 * i + 30], 10 * i + 31) for i in range(10)]
    assert throughput_per_s(done, "throughput", 3) == pytest.approx(100.0)
    links = {"e>m": {"bandwidth_Bps": 1e6, "rtt_ms": 0.2}, "m>c": {"bandwidth_Bps": 2e6}}
    s = summarize(done, mode="throughput", in_flight=3, batch=2, links=links)
    row, stages = s["row"], s["stages"]
    assert row["items_per_s"] == pytest.approx(200.0)
    assert row["latency_ms_p50"] == pytest.approx(31.0)
    assert [st["instance"] for st in stages] == ["e", "m", "c"]
    # stage time = compute + bytes / bandwidth + rtt / 2 (the last: its send time)
    assert stages[0]["stage_ms"] == pytest.approx(10 + 1.0 + 0.1)
    assert stages[1]["stage_ms"] == pytest.approx(10 + 0.5)
    assert stages[2]["stage_ms"] == pytest.approx(10 + 0.5)
    assert row["bound_per_s"] == pytest.approx(1000 / 11.1)
    assert stages[1]["utilization"] == pytest.approx(100 / 100)  # busy back to back
    assert row["bytes_per_inference"] == 3000
    rows = stage_rows(done[0], route.label, "throughput")
    assert [r["hop"] for r in rows] == [0, 1, 2] and rows[1]["config"] == "3/9"


def test_a_pipeline_summary_compares_with_the_baselines_of_the_same_run():
    from app_api.runner.pipeline import pipeline_summary

    configs = [
        {"cuts": [3, 9], "chain": ["e", "m", "c"], "mode": "throughput", "in_flight": 4,
         "throughput_per_s": 90.0, "bound_per_s": 100.0, "predicted_throughput_per_s": 99.0,
         "stages": [{"hop": 0}]},
        {"cuts": [3, 9], "chain": ["e", "m", "c"], "mode": "latency", "throughput_per_s": 40.0},
        {"cuts": [], "chain": ["m"], "mode": "single", "throughput_per_s": 45.0},
        {"cuts": [], "chain": ["e"], "mode": "single", "throughput_per_s": 30.0},
    ]
    s = pipeline_summary(configs)
    assert s["throughput_per_s"] == 90.0 and s["bound_per_s"] == 100.0
    assert s["stages"] == [{"hop": 0}]
    r = s["pipeline"]["ratios"]
    assert r["throughput_over_bound"] == pytest.approx(0.9)
    assert r["pipelined_over_sequential"] == pytest.approx(2.25)
    assert r["pipelined_over_single"] == pytest.approx(2.0)
    assert r["predicted_over_measured"] == pytest.approx(1.1)
    assert s["pipeline"]["best_single"] == "m"
    assert pipeline_summary([]) == {}


def test_a_quota_d_host_is_planned_at_its_sustained_speed():
    from experiment_design.partitioners.pipeline_partitioners import sustained_factor

    assert sustained_factor({"full_ms": 10, "full_cpu_ms": 10}) == 1.0
    q = {"full_ms": 10, "full_cpu_ms": 10, "cpu_quota": {"fraction": 0.5}}
    assert sustained_factor(q) == pytest.approx(2.0)
    # a multi-threaded pass already uses more than its quota's share per wall second
    assert sustained_factor({**q, "full_cpu_ms": 15}) == pytest.approx(3.0)
    assert sustained_factor({**q, "cpu_quota": {"fraction": 4.0}}) == 1.0


def test_a_quota_d_host_is_planned_at_the_share_the_lab_measured_under_its_quota():
    # 0.6 core at a 1.667 ms period (under the 4 ms tick) gave a busy loop 0.47 of a core:
    # planned at 0.6, pipeline-dp predicted 1.20x the throughput measured.
    from app_api.runner.labfacts import quota_from_report
    from experiment_design.partitioners.pipeline_partitioners import sustained_factor

    report = {"cpu": {"lab-1": {"quota": 0.6, "measured": 0.47, "period_us": 1667}}}
    quota = quota_from_report(report, "lab-1")
    assert quota["fraction"] == 0.6 and quota["measured"] == 0.47
    prof = {"full_ms": 10, "full_cpu_ms": 10, "cpu_quota": quota}
    assert sustained_factor(prof) == pytest.approx(1 / 0.47)


def test_a_busy_stage_is_planned_at_the_share_it_got_with_every_host_busy():
    # three paced 0.6 hosts on two CPUs: 0.60 each alone, 0.52-0.57 all busy at once, and
    # the busy stage of a pipeline ran at 0.54-0.57 of a core (stage wall / CPU)
    from app_api.runner.labfacts import quota_from_report
    from experiment_design.partitioners.pipeline_partitioners import sustained_factor

    report = {"cpu": {"lab-1": {"quota": 0.6, "measured": 0.6, "measured_together": 0.54,
                                "period_us": 1000, "mode": "duty"}}}
    prof = {"full_ms": 10, "full_cpu_ms": 10, "cpu_quota": quota_from_report(report, "lab-1")}
    assert sustained_factor(prof) == pytest.approx(1 / 0.54)
