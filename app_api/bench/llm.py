"""A token pipeline's instrumentation against ``transformers``' own ``generate``.

One stage on one host: tracr's generation path (the chain's head, the decoder split
mode with its per-layer timers and per-sequence KV caches, the feed-back loop of
:mod:`experiment_design.runtime.generation`) generates ``--tokens`` greedy tokens from
the fixed prompt, and ``model.generate(..., do_sample=False, max_new_tokens=N)`` does
the same on the same model and prompt, in the same process, rounds alternating.

- ``tpot_ms_tracr``: tracr's time per output token, the span from the first token to the
  last over ``N - 1`` (median over rounds);
- ``tpot_ms_generate``: ``generate``'s, as (time for N tokens - time for 1 token) /
  (N - 1), which takes its prefill out the same way (median over rounds);
- ``tpot_over_generate``: the median over rounds of their ratio in each round (the two
  sides of a round run seconds apart, alternating which goes first), target <= 1.05
  (the instrumentation does not distort what it measures);
- ``tokens_match``: tracr's tokens are exactly ``generate``'s.

Then the fidelity of lossy activations at a cut (``--cut``, the middle layer by
default), each method of ``--lossy`` through the transport's own codec, against the
unsplit model over the shipped prompt set
(:mod:`experiment_design.runtime.token_fidelity`), ``--fidelity-tokens`` tokens a
prompt: ``<m>_token_agreement`` (teacher-forced; target >= 0.99 for int8),
``<m>_free_agreement``, ``<m>_identical_sequences``, ``<m>_logits_cosine_mean`` /
``_min`` and ``<m>_bytes_per_token`` beside ``fp32_bytes_per_token`` (``m``: ``fp16``,
``int8``, ...). ``--fidelity-tokens 0`` leaves them out.

Needs the optional extra (``make llm``). Example: ``tracr bench llm --json``.

``--placement`` is another mode: the model placed over a lab's hosts by three policies,
each run and measured (:mod:`app_api.bench.llm_lab`; ``sudo tracr bench llm --placement
--json``, ``--no-caps`` for the lab without its memory caps).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from types import SimpleNamespace
from typing import Any

from app_api.bench import llm_lab
from experiment_design.models.llm import load_llm, prompt_ids
from experiment_design.runtime import heap
from experiment_design.runtime.chain import ChainHead, Route
from experiment_design.runtime.generation import generate, summarize
from experiment_design.runtime.token_fidelity import measure, shipped_prompts
from experiment_design.tasks.generate import DEFAULT_PROMPT

TARGET = 1.05
#: int8 activations at the cuts keep at least this token agreement
AGREEMENT = 0.99
_SHORT = {"float16": "fp16", "bfloat16": "bf16"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``tracr bench llm``."""
    p.add_argument("--model", default="smollm2-135m", help="a registered language model")
    p.add_argument("--tokens", type=int, default=32, help="tokens to generate")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds of each")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--prompt", default=None, help="the prompt (default: the task's)")
    p.add_argument("--cut", type=int, default=None,
                   help="the cut for fidelity (default: the middle decoder layer)")
    p.add_argument("--lossy", default="float16,int8",
                   help="lossy methods at the cut, comma-separated (the transport's)")
    p.add_argument("--fidelity-tokens", type=int, default=32,
                   help="tokens per prompt of the fidelity set (0: no fidelity)")
    llm_lab.add_arguments(p)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure both, side by side; the result with its targets (with ``--placement``,
    the placement mode instead: :mod:`app_api.bench.llm_lab`)."""
    if getattr(args, "placement", False):
        return llm_lab.run(args)
    import torch

    from experiment_design.split.decoder import DecoderSplit  # loads torch: not at tracr --help

    torch.set_num_threads(int(args.threads))
    n = int(args.tokens)
    model = load_llm(args.model)
    sm = DecoderSplit(model, name=args.model).to("cpu")
    ids = prompt_ids(args.model, args.prompt or DEFAULT_PROMPT)
    owner = SimpleNamespace(split_model=sm, instance="head", downstream={},
                            cancel_event=threading.Event(), stop_event=threading.Event())
    head = ChainHead(owner)
    route = Route(("head",), ())
    x = torch.tensor([ids])
    mask = torch.ones_like(x)

    def hf(tokens: int) -> tuple[float, list[int]]:
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model.generate(x, attention_mask=mask, do_sample=False,
                                 max_new_tokens=tokens, min_new_tokens=tokens)
            return time.perf_counter() - t0, out[0, len(ids):].tolist()

    # warm-up of both paths, then freeze what loading left (no full collection mid-run)
    hf(4)
    generate(head, route, [ids], 4, first_seq=-1)
    heap.settle()
    ours, theirs, figures = [], [], None
    tokens_hf: list[int] = []
    tokens_tracr: list[int] = []
    for r in range(int(args.rounds)):
        # each side goes first in every other round: a machine that slows down during a
        # round then weighs on both sides alike
        for side in ((0, 1) if r % 2 == 0 else (1, 0)):
            if side == 0:
                t_n, tokens_hf = hf(n)
                t_1, _ = hf(1)
                theirs.append((t_n - t_1) / (n - 1) * 1e3)
            else:
                (seq,) = generate(head, route, [ids], n, first_seq=r)
                tokens_tracr = seq.tokens
                ours.append((seq.token_ns[-1] - seq.token_ns[0]) / 1e6 / (n - 1))
                figures = summarize([seq], route, [sm.weight_bytes(0, sm.n)])
    # the median of each round's ratio: the two sides of a ratio ran seconds apart
    ratio = statistics.median(a / b for a, b in zip(ours, theirs, strict=True))
    match = tokens_tracr == tokens_hf
    fidelity = _fidelity(args, model, sm.n)
    met = {"tpot_over_generate": ratio <= TARGET, "tokens_match": match}
    targets = {"tpot_over_generate": f"<= {TARGET}", "tokens_match": "true"}
    if "int8_token_agreement" in fidelity:
        met["int8_token_agreement"] = fidelity["int8_token_agreement"] >= AGREEMENT
        targets["int8_token_agreement"] = f">= {AGREEMENT}"
    return {
        "model": args.model, "tokens": n, "rounds": int(args.rounds),
        "threads": int(args.threads), "prompt_tokens": len(ids),
        "tpot_ms_tracr": statistics.median(ours), "tpot_ms_generate": statistics.median(theirs),
        "tpot_ms_tracr_rounds": ours, "tpot_ms_generate_rounds": theirs,
        "tpot_over_generate": ratio, "tokens_match": match,
        "ttft_ms": (figures or {}).get("ttft_ms"),
        "tpot_ms_p50": (figures or {}).get("tpot_ms_p50"),
        "tpot_ms_p99": (figures or {}).get("tpot_ms_p99"),
        **fidelity,
        "targets": targets, "met": met,
        "exit_code": 0 if all(met.values()) else 1,
    }


def _fidelity(args: argparse.Namespace, model: Any, n: int) -> dict[str, Any]:
    """The lossy methods' fidelity at the cut, flat keys (see the module docstring)."""
    tokens = int(args.fidelity_tokens)
    methods = [m.strip() for m in str(args.lossy).split(",") if m.strip()]
    if tokens <= 0 or not methods:
        return {}
    cut = int(args.cut) if args.cut is not None else n // 2
    prompts = [prompt_ids(args.model, p, seed=i) for i, p in enumerate(shipped_prompts())]
    f = measure(model, prompts, [cut], methods, tokens=tokens)
    out: dict[str, Any] = {"fidelity_cut": cut, "fidelity_prompts": len(prompts),
                           "fidelity_tokens": tokens,
                           "fp32_bytes_per_token": f["fp32"]["bytes_per_token"][0]}
    for m in methods:
        short = _SHORT.get(m, m)
        for key, value in f[m].items():
            out[f"{short}_{key}"] = value[0] if key == "bytes_per_token" else value
    return out
