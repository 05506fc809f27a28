"""A token pipeline's figures on the observer: taken out of the configuration rows into
summary.json's llm section, and printed by results show (no transformers needed)."""

from __future__ import annotations

from types import SimpleNamespace

from app_api.results.llm import llm_lines
from app_api.results.metrics import metrics_lines
from app_api.runner.llm import take_generations

FIGURES = {"model": "smollm2-135m", "route": ["head-1", "stage-1"], "cuts": [15],
           "sequences": 1, "new_tokens": 32, "prompt_tokens": 38, "in_flight": 1,
           "ttft_ms": 510.3, "tpot_ms_p50": 134.7, "tpot_ms_p90": 249.8, "tpot_ms_p99": 301.3,
           "tokens_per_s_per_sequence": 6.1, "tokens_per_s_total": 5.7,
           "prefill_tokens_per_s": 74.5, "bytes_per_token_at_cuts": [2304.0],
           "stages": [{"instance": "head-1", "layers": [1, 15], "compute_ms_per_token": 58.3,
                       "bytes_per_token": 2304.0, "weight_bytes": 325651968,
                       "kv_cache_bytes_peak": 1589760},
                      {"instance": "stage-1", "layers": [16, 30],
                       "compute_ms_per_token": 75.7, "bytes_per_token": None,
                       "weight_bytes": 325654272, "kv_cache_bytes_peak": 1589760}]}


def test_a_generation_goes_to_the_summary_not_to_configs_csv():
    state = SimpleNamespace(extra={})
    other = {"mode": "latency", "cuts": [3]}
    rest = take_generations(state, [{"mode": "generate", "llm": FIGURES}, other])
    assert rest == [other] and state.extra["llm"]["ttft_ms"] == 510.3
    take_generations(state, [{"mode": "generate", "llm": {**FIGURES, "cuts": [10]}}])
    assert state.extra["llm"]["cuts"] == [15]
    assert state.extra["llm"]["more"][0]["cuts"] == [10]


def test_results_show_prints_ttft_tpot_and_each_stage():
    lines = llm_lines({"llm": FIGURES})
    assert "time to first token 510.3 ms" in lines[1] and "p99 301.3 ms" in lines[1]
    assert "head-1: layers 1..15" in lines[3] and "2.2 KiB/token" in lines[3]
    assert "stage-1: layers 16..30" in lines[4] and "sends" not in lines[4]
    assert llm_lines({}) == []


def test_metrics_lines_of_a_run_without_inference_rows():
    """A token pipeline records no inference rows: its energy has joules over the run's
    window but nothing per inference. metrics_lines raised KeyError 'interval' on it, and
    with it every 'tracr experiment run' of such a run exited 1 after it had succeeded."""
    summary = {"metrics": {"head-1": {"memory": {"peak_rss_kb": 1633460}, "energy": {
        "estimate": {"status": "ok", "label": "estimated", "joules": 88.5, "window_s": 14.0,
                     "joules_interval": [87.2, 89.8]}}}}}
    (line,) = [x for x in metrics_lines(summary) if x.startswith("head-1")]
    assert "estimate 88.5 J over 14.0 s (estimated)" in line


def test_each_member_of_a_token_pipeline_is_assigned_only_the_layers_its_routes_need():
    from app_api.manifest import load_manifest
    from app_api.runner.llm import llm_setup, stage_layers

    m = load_manifest("smollm2-pipeline")
    assert stage_layers(m) == {"head-1": [0, 15], "stage-1": [15, None]}
    assert llm_setup(m, "stage-1") == {"llm_layers": [15, None]}
    # two generate tasks with other cuts: each member holds what covers both routes
    m = load_manifest("smollm2-pipeline", [
        "playbook.head-1.0.params.cuts=[10]",
        "playbook.head-1.1={task: generate, params: {cuts: [20]}}"])
    assert stage_layers(m) == {"head-1": [0, 20], "stage-1": [10, None]}
    # a vision model's set-up is unchanged
    assert llm_setup(SimpleNamespace(model={"name": "alexnet"}, pipeline=None,
                                     playbook={}), "edge-1") == {}


def test_a_token_pipeline_that_would_not_fit_the_labs_memory_caps_is_refused(monkeypatch):
    import pytest

    pytest.importorskip("transformers", reason="the llm extra is not installed (make llm)")
    from app_api import lab
    from app_api.manifest import load_manifest
    from app_api.runner import llm
    from experiment_design.errors import TracrError

    m = load_manifest("llm-placement-lab", [f"participant_instances.{i}.device=localhost"
                                            for i in range(3)])
    on_lab = SimpleNamespace(model=m.model, pipeline=m.pipeline, playbook=m.playbook,
                             participant_instances=[
                                 {**inst, "device": dev} for inst, dev in
                                 zip(m.participant_instances, ("lab-3", "lab-1", "lab-2"),
                                     strict=True)])

    def capped(cap: int) -> None:
        monkeypatch.setattr(lab, "load_state", lambda: {"hosts": [
            {"name": f"lab-{i}", "memory_bytes": cap} for i in (1, 2, 3)]})

    capped(1_600_000_000)
    llm.check_memory(on_lab)  # the manifest's caps: every stage fits
    capped(950_000_000)
    # the last stage holds 8 layers and the 151936 x 896 LM head, and a 512-token cache
    with pytest.raises(TracrError, match=r"stage-2 on lab-2 \(layers 17\.\.24\) needs "
                                         r"1025\.9 MB, cap 950\.0 MB \(weights and") as e:
        llm.check_memory(on_lab)
    # the others fit (15 layers: 903 MB; the embedding and a layer: 605 MB)
    assert "stage-1" not in str(e.value) and "head-1" not in str(e.value)
    assert "llm_placement" in e.value.hint
    capped(0)  # no caps: nothing to check
    monkeypatch.setattr(lab, "load_state", lambda: {"hosts": [{"name": "lab-1"}]})
    llm.check_memory(on_lab)
