"""What one decode step of a language model costs on this host: the figures a placement
over hosts plans from (:mod:`experiment_design.partitioners.llm_placement`).

The decoder layers of one model all have the same shape, so the probe builds the model
with only a few of them (``layers``, 2 by default; random weights drawn as a config-only
model draws them) and the real embedding, final norm and LM head, which is a few hundred
MB where the whole model would not fit a capped host. It prefills a KV cache of
``context_tokens`` tokens (a realistic context: a decode step's attention reads it), then
times ``steps`` decode steps, one token each, through the decoder split mode's own timed
path (:class:`~experiment_design.split.decoder.DecoderSplit`, the code a stage runs):

- ``embed_ms``: the embedding of one token (median over steps);
- ``layer_ms``: one decoder layer's decode step (median over every probed layer of every
  step), the figure for each of the model's layers;
- ``head_ms``: the final norm and the LM head (median);
- ``runtime_bytes``: this process's resident memory after importing torch and
  ``transformers`` and before building the model: what a stage's process takes beside
  its weights and KV cache.

Run as a script (``python -m experiment_design.runtime.decode_probe MODEL``) it sets
itself up (imports, the model, the prefill), prints ``ready``, waits for a line on stdin
and then measures, so a caller can place it in a CPU quota between the two (set-up at
full speed, measurement under the quota), and prints the figures as one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from experiment_design.models.llm import get_llm_spec, llm_skeleton
from experiment_design.models.llm_weights import build_stage


@dataclass(frozen=True)
class DecodeProbe:
    """One host's measured decode costs (see the module docstring); ms per token."""

    model: str
    layers_probed: int
    context_tokens: int
    steps: int
    embed_ms: float
    layer_ms: float
    head_ms: float
    runtime_bytes: int
    #: every probed layer's decode ms of every step (what ``layer_ms`` is the median of)
    layer_samples: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON view."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DecodeProbe:
        """The inverse of :meth:`to_dict`."""
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in fields}
        kw["layer_samples"] = tuple(kw.get("layer_samples") or ())
        return cls(**kw)


def _rss_bytes() -> int:
    """This process's resident memory now (Linux; the peak elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def probe_decode(name: str, *, layers: int = 2, context_tokens: int = 512, steps: int = 12,
                 seed: int = 0, threads: int = 1,
                 ready: Callable[[], None] = lambda: None) -> DecodeProbe:
    """Measure ``name``'s decode costs here (module docstring). ``ready`` is called
    between the set-up and the measurement."""
    import torch
    import transformers  # noqa: F401  (its import is part of the runtime a stage takes)
    from transformers import AutoConfig

    # the split package loads torch: not at tracr --help, which imports DecodeProbe
    from experiment_design.split.decoder import DecoderSplit

    torch.set_num_threads(int(threads))
    runtime = _rss_bytes()
    cfg = dict(get_llm_spec(name).config or {})
    if not cfg:  # a GGUF model: its config from the file, its weights drawn all the same
        cfg = llm_skeleton(name).config.to_dict()
    cfg["num_hidden_layers"] = int(layers)
    cfg.pop("layer_types", None)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    sm = DecoderSplit(build_stage(config, None, seed=seed), name=name).to("cpu")
    g = torch.Generator().manual_seed(seed)
    vocab = int(config.vocab_size)
    prompt = torch.randint(0, vocab, (1, int(context_tokens)), generator=g)
    with torch.inference_mode():
        out, _ = sm.run_full({"ids": prompt, "seq": 0, "pos": 0})
        token = out["token"].reshape(1, 1)
        pos = int(context_tokens)
        # one untimed step: first-call costs (allocations, kernels' set-up) stay out
        out, _ = sm.run_full({"ids": token, "seq": 0, "pos": pos})
        token, pos = out["token"].reshape(1, 1), pos + 1
        ready()
        embed, layer, head = [], [], []
        for _ in range(int(steps)):
            out, times = sm.run_full({"ids": token, "seq": 0, "pos": pos}, timed=True)
            token, pos = out["token"].reshape(1, 1), pos + 1
            for i, ms in times:
                (embed if i == 0 else head if i == sm.n + 1 else layer).append(ms)
    return DecodeProbe(name, int(layers), int(context_tokens), int(steps),
                       statistics.median(embed), statistics.median(layer),
                       statistics.median(head), int(runtime), tuple(layer))


def main(argv: list[str] | None = None) -> int:
    """The script: set up, print ``ready``, wait for a line, measure, print JSON."""
    p = argparse.ArgumentParser(description="time one decode step of a language model")
    p.add_argument("model")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)

    def ready() -> None:
        print("ready", flush=True)
        sys.stdin.readline()

    probe = probe_decode(args.model, layers=args.layers, context_tokens=args.context,
                         steps=args.steps, seed=args.seed, threads=args.threads, ready=ready)
    print(json.dumps(probe.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
