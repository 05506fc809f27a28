"""The decoder split mode and token generation on small causal LMs built from a config
(random weights, real ``transformers`` modules): every cut generates the unsplit
model's tokens, each stage keeps only its own layers' KV cache, and the figures add up."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

transformers = pytest.importorskip(
    "transformers", reason="the llm extra is not installed (make llm)")
torch = pytest.importorskip("torch")

from experiment_design.errors import TracrError  # noqa: E402
from experiment_design.runtime.chain import ChainHead, Route  # noqa: E402
from experiment_design.runtime.generation import generate, summarize  # noqa: E402
from experiment_design.split.decoder import DecoderSplit, next_token  # noqa: E402

TINY = {
    "llama": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
              "max_position_embeddings": 256, "tie_word_embeddings": True},
    "qwen2": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 5,
              "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 280,
              "max_position_embeddings": 256, "use_sliding_window": False},
}
PROMPT = [5, 17, 42, 9, 100, 3, 77]
N = 10


def tiny(kind: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(kind, **TINY[kind])
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def reference(model) -> list[int]:
    x = torch.tensor([PROMPT])
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=N, min_new_tokens=N, pad_token_id=0)
    return out[0, len(PROMPT):].tolist()


def by_hand(stages: list[DecoderSplit], cuts: list[int], reply: str = "token"
            ) -> tuple[list[int], list[int]]:
    """Generate through ``stages`` (one DecoderSplit each) message by message."""
    bounds = [0, *cuts, stages[0].n]
    tokens, kv, feed, pos = [], [], PROMPT, 0
    with torch.inference_mode():
        for step in range(N):
            msg = {"ids": torch.tensor([feed]), "seq": 7, "pos": pos,
                   "end": step == N - 1, "reply": reply}
            for k, sm in enumerate(stages):
                msg, times = sm._run(bounds[k], bounds[k + 1], msg, timed=True)
                assert [i for i, _ in times][-1] == (bounds[k + 1] + (k == len(stages) - 1))
            tokens.append(next_token(msg))
            kv = msg["kv"].tolist()
            pos += len(feed)
            feed = [tokens[-1]]
    return tokens, kv


@pytest.mark.parametrize("kind", sorted(TINY))
def test_every_cut_generates_the_unsplit_models_tokens(kind):
    model = tiny(kind)
    ref = reference(model)
    n = model.config.num_hidden_layers
    for cuts in ([], [1], [n // 2], [n - 1], [1, n - 1], [1, 2, 3]):
        stages = [DecoderSplit(model) for _ in range(len(cuts) + 1)]
        tokens, kv = by_hand(stages, cuts)
        assert tokens == ref, (kind, cuts)
        # each stage held its own layers' cache, and dropped it at the sequence's end
        bounds = [0, *cuts, n]
        per_token = 2 * model.config.num_key_value_heads * (64 // 4) * 4
        seen = len(PROMPT) + N - 1
        assert kv == [(b - a) * per_token * seen for a, b in zip(bounds, bounds[1:], strict=False)]
        assert all(not sm.caches for sm in stages)
    # the last stage may send the logits instead: the head's choice is the same
    assert by_hand([DecoderSplit(model), DecoderSplit(model)], [2], reply="logits")[0] == ref


def test_a_step_of_an_unknown_sequence_is_refused():
    sm = DecoderSplit(tiny("llama"))
    with pytest.raises(TracrError, match="no KV cache"):
        sm._run(0, 2, {"ids": torch.tensor([[1]]), "seq": 3, "pos": 5}, timed=False)


def test_weights_and_layer_facts_count_each_stage_once():
    model = tiny("llama")
    sm = DecoderSplit(model)
    total = sum(p.numel() * 4 for p in model.parameters())  # tied: counted once
    embed = model.model.embed_tokens.weight.numel() * 4
    # split anywhere: both ends hold the (tied) embedding / LM head matrix
    assert sm.weight_bytes(0, 3) + sm.weight_bytes(3, 6) == total + embed
    assert sm.weight_bytes(0, 6) == total
    facts = sm.layer_facts()
    assert [f["layer"] for f in facts] == list(range(1, 7))
    assert sum(f["weight_bytes"] for f in facts) == sum(
        p.numel() * 4 for p in model.model.layers.parameters())


def test_generation_through_the_chain_head_and_its_figures():
    """One stage through the chain's head: the path a run's head takes."""
    model = tiny("qwen2")
    sm = DecoderSplit(model)
    owner = SimpleNamespace(split_model=sm, instance="h", downstream={},
                            cancel_event=threading.Event(), stop_event=threading.Event())
    route = Route(("h",), ())
    seqs = generate(ChainHead(owner), route, [PROMPT, PROMPT], N)
    ref = reference(model)
    assert [s.tokens for s in seqs] == [ref, ref]
    fig = summarize(seqs, route, [sm.weight_bytes(0, sm.n)])
    assert fig["sequences"] == 2 and fig["new_tokens"] == N
    assert fig["ttft_ms"] > 0 and fig["tpot_ms_p50"] <= fig["tpot_ms_p99"]
    assert fig["prefill_tokens_per_s"] > 0 and fig["tokens_per_s_total"] > 0
    (stage,) = fig["stages"]
    assert stage["layers"] == [1, sm.n] and stage["compute_ms_per_token"] > 0
    assert stage["memory_bytes_peak"] == stage["weight_bytes"] + stage["kv_cache_bytes_peak"]
    # as the stage reported them: what it holds, and its process's peak resident memory
    assert stage["weight_bytes"] == sm.held_bytes() and stage["rss_bytes_peak"] > 0
    # every layer's decode time, the embedding (0) and the LM head (n + 1) included
    assert list(stage["layer_ms_per_token"]) == [str(i) for i in range(sm.n + 2)]


@pytest.mark.parametrize("kind", sorted(TINY))
def test_stages_holding_only_their_own_weights_generate_the_unsplit_models_tokens(kind):
    from transformers import AutoConfig

    from experiment_design.models.llm_weights import build_stage

    cfg = AutoConfig.for_model(kind, **TINY[kind])
    whole = DecoderSplit(build_stage(cfg, None, seed=3))
    ref = reference(whole.model)
    n = whole.n
    cuts = [2, n - 1]
    bounds = [0, *cuts, n]
    stages = [DecoderSplit(build_stage(cfg, (a, b if b < n else None), seed=3))
              for a, b in zip(bounds, bounds[1:], strict=False)]
    assert by_hand(stages, cuts)[0] == ref
    for sm, a, b in zip(stages, bounds, bounds[1:], strict=False):
        # each holds exactly its own weights (a tied LM head: the embedding matrix once)
        assert sm.held_bytes() == whole.weight_bytes(a, b) == sm.weight_bytes(a, b)
        assert sm.held == (a, b) and sm.layer_facts() == whole.layer_facts()
    assert sum(sm.held_bytes() for sm in stages) < 2 * whole.held_bytes()
    head, middle, last = stages
    assert head.holds_embedding and not head.holds_head and last.holds_head
    # a range it does not hold is refused, naming what it holds
    with pytest.raises(TracrError, match=r"holds layers 3\.\.\d+, not layers 2\.\."):
        middle._run(1, n - 1, {"h": torch.zeros(1, 1, 64), "seq": 1, "pos": 0}, timed=False)
    with pytest.raises(TracrError, match="not layers 1..2 with the embedding"):
        middle._run(0, 2, {"ids": [1], "seq": 1, "pos": 0}, timed=False)


def test_token_fidelity_of_lossy_activations_at_the_cuts():
    from experiment_design.runtime.token_fidelity import measure, shipped_prompts

    assert len(shipped_prompts()) >= 8  # the fixed set ships with the package
    model = tiny("llama")
    prompts = [PROMPT, [9, 8, 7, 6, 5]]
    f = measure(model, prompts, [3], ["float16", "int8"], tokens=6)
    hidden = 64
    assert f["fp32"] == {"bytes_per_token": [hidden * 4], "token_agreement": 1.0}
    assert f["float16"]["bytes_per_token"] == [hidden * 2]
    # int8: a byte a value, and a scale and zero point (5 bytes) per group of values
    from experiment_design.split.decoder import GROUP

    assert f["int8"]["bytes_per_token"] == [hidden + 5 * hidden // GROUP]
    for method in ("float16", "int8"):
        g = f[method]
        assert 0 <= g["free_agreement"] <= 1 and 0 <= g["identical_sequences"] <= 1
        assert g["logits_cosine_min"] <= g["logits_cosine_mean"] <= 1 + 1e-6
    assert f["float16"]["logits_cosine_min"] > 0.999
