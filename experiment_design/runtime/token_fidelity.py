"""Token fidelity of a token pipeline whose cuts carry lossy activations.

Each cut's hidden state goes through the transport's own codec (``encode_tensor`` then
``decode``, as a data channel sends and receives it) with a lossy reduction (``float16``,
``int8``, ...; ``granularity: channel``, so int8 takes a scale per group of
:data:`~experiment_design.split.decoder.GROUP` values), and the run is compared with the unsplit model's (fp32, no reduction,
which the decoder split reproduces exactly) over a fixed prompt set
(``experiment_design/models/llm_prompts.txt``):

- ``token_agreement``: teacher-forced: every decode step is fed the unsplit model's
  previous token, and the step's greedy choice is compared with the unsplit model's, so
  one flipped token counts once, not for the rest of its sequence;
- ``free_agreement``: free-running: each side feeds back its own tokens; the fraction of
  positions where the two sequences hold the same token (a flip usually ends agreement);
- ``identical_sequences``: the fraction of prompts whose free-running tokens all match;
- ``logits_cosine_mean`` / ``_min``: the cosine of each teacher-forced step's logits with
  the unsplit model's;
- ``bytes_per_token``: a decode step's encoded bytes at each cut (median over steps).

torch, the split engine and the transport (which load torch) are imported inside the
functions that use them, for start-up time: ``tracr experiment validate`` imports this
module through the roles and loads no torch (``tests/unit/test_cli_experiment.py``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from importlib import resources
from typing import Any

#: the shipped prompt set
PROMPTS_FILE = "llm_prompts.txt"


def shipped_prompts() -> list[str]:
    """The fixed prompt set (comments and blank lines left out)."""
    text = resources.files("experiment_design.models").joinpath(PROMPTS_FILE).read_text()
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


@dataclass
class _Run:
    tokens: list[int]
    logits: list[Any]
    cut_bytes: list[list[int]]  # per decode step, per cut


def _steps(stages: list[Any], cuts: list[int], codec: Any, prompt: list[int], n: int,
           feed: list[int] | None, seq: int) -> _Run:
    """``n`` steps through ``stages`` (DecoderSplits sharing a model), each cut's hidden
    state through ``codec`` (None: as it is); fed ``feed`` (teacher forcing) or its own
    greedy tokens."""
    import torch

    from experiment_design.transport.codec import decode, encode_tensor, parse_entry

    bounds = [0, *cuts, stages[0].n]
    tokens, logits, sizes = [], [], []
    ids, pos = list(prompt), 0
    with torch.inference_mode():
        for step in range(n):
            msg: dict[str, Any] = {"ids": torch.tensor([ids]), "seq": seq, "pos": pos,
                                   "end": step == n - 1, "reply": "logits"}
            row = []
            for k, sm in enumerate(stages):
                if k:
                    h = msg["h"]
                    if codec is not None:
                        enc = encode_tensor("h", h, codec)
                        row.append(enc.encoded_nbytes)
                        msg = {**msg, "h": decode(parse_entry(enc.entry()), enc.payload())}
                    else:
                        row.append(h.numel() * h.element_size())
                msg, _ = sm._run(bounds[k], bounds[k + 1], msg, timed=False)
            out = msg["logits"].float()
            logits.append(out)
            tokens.append(int(out.argmax()))
            if step:
                sizes.append(row)
            pos += len(ids)
            ids = [feed[step] if feed is not None else tokens[-1]]
    return _Run(tokens, logits, sizes)


def measure(model: Any, prompts: list[list[int]], cuts: list[int], methods: list[str], *,
            tokens: int = 16, granularity: str = "channel") -> dict[str, Any]:
    """Fidelity of each lossy ``method`` at ``cuts`` against the unsplit model (fp32),
    over ``prompts`` (token ids), ``tokens`` greedy tokens each: ``{"fp32": {...},
    method: {...}}`` with the figures of the module docstring."""
    import torch

    from experiment_design.split.decoder import DecoderSplit
    from experiment_design.transport import CodecConfig

    stages = [DecoderSplit(model) for _ in range(len(cuts) + 1)]
    refs = [_steps(stages, cuts, None, p, tokens, None, i) for i, p in enumerate(prompts)]
    out: dict[str, Any] = {"fp32": {"bytes_per_token": _per_cut(refs, len(cuts)),
                                    "token_agreement": 1.0}}
    for method in methods:
        codec = CodecConfig(codec="none", level=0, lossy=method, granularity=granularity)
        agree, total, free, same, cos = 0, 0, 0, 0, []
        runs = []
        for i, (p, ref) in enumerate(zip(prompts, refs, strict=True)):
            forced = _steps(stages, cuts, codec, p, tokens, ref.tokens, i)
            runs.append(forced)
            agree += sum(a == b for a, b in zip(forced.tokens, ref.tokens, strict=True))
            total += len(ref.tokens)
            cos += [float(torch.nn.functional.cosine_similarity(a, b, dim=0))
                    for a, b in zip(forced.logits, ref.logits, strict=True)]
            own = _steps(stages, cuts, codec, p, tokens, None, i)
            matched = sum(a == b for a, b in zip(own.tokens, ref.tokens, strict=True))
            free += matched
            same += matched == len(ref.tokens)
        out[method] = {
            "token_agreement": agree / total, "free_agreement": free / total,
            "identical_sequences": same / len(prompts),
            "logits_cosine_mean": statistics.fmean(cos), "logits_cosine_min": min(cos),
            "bytes_per_token": _per_cut(runs, len(cuts)),
        }
    return out


def _per_cut(runs: list[_Run], cuts: int) -> list[float]:
    return [statistics.median(row[c] for r in runs for row in r.cut_bytes) for c in range(cuts)]
