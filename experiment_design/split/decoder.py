"""The decoder split mode: a language model cut at decoder-layer boundaries, each stage
keeping the KV cache of its own layers.

The graph and hooks engines trace a model once and cut the trace; a causal LM with a
cache does not trace cleanly (the cache is mutable state that lives across calls). This
mode instead calls the model's own modules (``embed_tokens``, ``layers[a:b]``, ``norm``,
``lm_head``) in the order the model's ``forward`` does, with one ``DynamicCache`` per
sequence on each stage, so a split run is exact by construction: the same modules see
the same inputs as in the unsplit model.

A stage is numbered like the other engines' cuts: layers are ``1 .. n`` (decoder layer
``i`` of the model is layer ``i + 1``), a stage runs ``a + 1 .. b``; the head also embeds
the tokens and the last stage also applies the final norm and the LM head.

What crosses a cut is one message (a dict): ``h`` (the hidden state of the step's tokens,
``[1, L, hidden]``: the whole prompt at prefill, one token at decode) and plain values
beside it: ``seq`` (the sequence id), ``pos`` (how many tokens of it the caches hold
before this step), ``end`` (drop the sequence's caches after this step) and ``kv`` (each
earlier stage's KV cache bytes, measured), ``held`` (each earlier stage's weight bytes,
as it holds them) and ``rss`` (each earlier stage's process peak resident memory). The
head's message has ``ids`` instead of ``h``. The last stage returns ``token`` (the
greedy choice, int64 ``[1]``; or ``logits`` with ``reply: "logits"``), then ``kv``,
``held`` and ``rss``, every stage's figure in stage order. A sequence's cache never
crosses the wire.

A stage may hold only its own weights (``load_llm(..., layers=(a, b))``, the others on
``meta``): it runs any range inside what it holds and refuses any other, naming both.

Supported: the Llama and Qwen2 families (``model.model.{embed_tokens, layers, norm,
rotary_emb}`` and ``lm_head``) with full attention.
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.models.llm_weights import held_range

#: the longest prompt a frame limit is sized for (tokens)
MAX_PROMPT_TOKENS = 4096
#: a hidden state crosses a cut viewed as groups of this many values, ``[1, L * hidden /
#: GROUP, GROUP]``, so the transport's per-channel int8 (``granularity: channel``, dim 1)
#: takes one scale and zero point per group: a decoder's hidden state has a few channels
#: far larger than the rest (SmolLM2's channel 507 averages 736 where most are near 1),
#: which one scale per tensor crushes. SmolLM2's token agreement (teacher-forced) over
#: the 10 shipped prompts x 32 tokens: per tensor 71%, groups of 16 99.4%; over 3 x 12:
#: groups of 32 94%, 16 97%, 8 100%; at 581, 666, 756 and 936 bytes a token (fp32:
#: 2,304). A prefill of more than 4096 groups (256 tokens of 576) goes per tensor: the
#: codec's channel limit.
GROUP = 16


@dataclass(frozen=True)
class DecoderPoint:
    """A cut between decoder layers, as far as a data channel needs to know: what crosses
    it and how large that may get (the frame limit)."""

    index: int
    crossing: tuple[str, ...]
    crossing_bytes: int


def _ns() -> int:
    return time.perf_counter_ns()


def _param_bytes(*modules: Any, held: bool = False) -> int:
    """The parameters' bytes (``held``: only those materialized, not on ``meta``)."""
    seen: set[int] = set()
    total = 0
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen:  # tied weights (embedding = LM head) count once
                seen.add(id(p))
                if not (held and p.is_meta):
                    total += p.numel() * p.element_size()
    return total


def peak_rss_bytes() -> int:
    """This process's peak resident memory (bytes; ``ru_maxrss`` is KiB on Linux)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


class DecoderSplit:
    """A causal LM run as stages of decoder layers, with per-sequence KV caches (see the
    module docstring). The ``run_*`` methods have the signatures
    :func:`experiment_design.runtime.chain.run_range` calls, so the chain's head and
    serving stages use this mode as they use a traced split."""

    mode = "decoder"

    def __init__(self, model: Any, name: str = "") -> None:
        base = getattr(model, "model", None)
        if base is None or not all(hasattr(base, a) for a in
                                   ("embed_tokens", "layers", "norm", "rotary_emb")):
            raise TracrError(f"{name or type(model).__name__}: the decoder split mode needs a "
                             "Llama/Qwen2-style causal LM (model.embed_tokens, layers, norm)")
        types = set(getattr(model.config, "layer_types", None) or ["full_attention"])
        if types != {"full_attention"}:
            raise TracrError(f"{name}: layer types {sorted(types)} are not supported yet "
                             "(full attention only)")
        self.name = name
        self.model = model
        self.base = base
        self.config = model.config
        self.layers = list(base.layers)
        self.n = len(self.layers)
        self.device: Any = None
        #: sequence id -> its DynamicCache (this stage's layers only are filled)
        self.caches: dict[int, Any] = {}
        hidden = int(self.config.hidden_size)
        self.hidden = hidden
        vocab = int(self.config.vocab_size)
        largest = max(MAX_PROMPT_TOKENS * hidden, vocab) * 4
        self.points = [DecoderPoint(i, ("ids",) if i == 0 else ("h",), largest)
                       for i in range(self.n + 1)]

        #: the decoder layers whose weights this stage holds, and whether it holds the
        #: embedding (the head) and the norm and LM head (the last stage)
        self.held = held_range(model)
        self._held_bytes: int | None = None
        self.holds_embedding = not base.embed_tokens.weight.is_meta
        self.holds_head = not model.lm_head.weight.is_meta and not any(
            p.is_meta for p in base.norm.parameters())

    # -- facts ----------------------------------------------------------------------------
    def valid_splits(self) -> list[int]:
        """Every decoder-layer boundary."""
        return list(range(self.n + 1))

    def weight_bytes(self, a: int, b: int) -> int:
        """The bytes of the parameters a stage running layers ``a + 1 .. b`` holds (the
        embedding on the head, the final norm and LM head on the last stage)."""
        mods = list(self.layers[a:b])
        if a == 0:
            mods.append(self.base.embed_tokens)
        if b == self.n:
            mods += [self.base.norm, self.model.lm_head]
        return _param_bytes(*mods)

    def grouped(self, h: Any) -> Any:
        """``h`` (``[1, L, hidden]``) as it crosses a cut: a view of groups of
        :data:`GROUP` values (as it is when ``hidden`` is not a multiple of it)."""
        if self.hidden % GROUP:
            return h
        return h.reshape(1, -1, GROUP)

    def held_bytes(self) -> int:
        """The bytes of the parameters this stage holds (not on ``meta``)."""
        if self._held_bytes is None:  # the weights never change: counted once
            self._held_bytes = _param_bytes(self.model, held=True)
        return self._held_bytes

    def holds(self, a: int, b: int) -> bool:
        """Whether this stage holds the weights to run layers ``a + 1 .. b``."""
        lo, hi = self.held
        return ((a == b or (lo <= a and b <= hi)) and (a > 0 or self.holds_embedding)
                and (b < self.n or self.holds_head))

    def describe_held(self) -> str:
        """What this stage holds, for a refusal."""
        lo, hi = self.held
        parts = [f"layers {lo + 1}..{hi}" if hi > lo else "no decoder layers"]
        if self.holds_embedding:
            parts.insert(0, "the embedding")
        if self.holds_head:
            parts.append("the norm and LM head")
        return ", ".join(parts)

    def layer_facts(self) -> list[dict]:
        """Per decoder layer: its weight bytes and its KV cache bytes per token (what a
        placement under memory caps needs)."""
        cfg = self.config
        heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None)
                       or cfg.hidden_size // cfg.num_attention_heads)
        kv = 2 * heads * head_dim * 4  # keys and values, fp32
        return [{"layer": i + 1, "weight_bytes": _param_bytes(m), "kv_bytes_per_token": kv}
                for i, m in enumerate(self.layers)]

    def to(self, device: Any) -> DecoderSplit:
        """Move the model to ``device`` (a name or torch.device)."""
        import torch

        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise TracrError(f"device {device!r} asked for, but CUDA is not available")
        for m in self.model.modules():  # what is on meta stays there: it is not held
            for p in m._parameters.values():
                if p is not None and not p.is_meta:
                    p.data = p.data.to(dev)
            for k, buf in m._buffers.items():
                if buf is not None and not buf.is_meta:
                    m._buffers[k] = buf.to(dev)
        self.device = dev
        return self

    def kv_bytes(self, seq: int) -> int:
        """The bytes of ``seq``'s KV cache on this stage (0 if it has none)."""
        cache = self.caches.get(seq)
        if cache is None:
            return 0
        total = 0
        for layer in getattr(cache, "layers", []):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if t is not None and hasattr(t, "numel"):
                    total += t.numel() * t.element_size()
        return total

    def drop(self, seq: int) -> None:
        """Forget ``seq``'s cache."""
        self.caches.pop(seq, None)

    # -- running --------------------------------------------------------------------------
    def run_full(self, x: dict, timed: bool = False) -> tuple[dict, list]:
        """Every layer (one stage): ``x`` is the head's message, the output the token."""
        return self._run(0, self.n, x, timed)

    def run_prefix(self, b: int, x: dict, timed: bool = False) -> tuple[dict, list]:
        """The head: embed ``x['ids']`` and run layers ``1 .. b``."""
        return self._run(0, b, x, timed)

    def run_stage(self, a: int, b: int, msg: dict, timed: bool = False) -> tuple[dict, list]:
        """A middle stage: layers ``a + 1 .. b`` on the message of cut ``a``."""
        return self._run(a, b, msg, timed)

    def run_suffix(self, a: int, msg: dict, timed: bool = False) -> tuple[dict, list]:
        """The last stage: layers ``a + 1 .. n``, the norm and the LM head."""
        return self._run(a, self.n, msg, timed)

    def _cache(self, seq: int, pos: int) -> Any:
        from transformers import DynamicCache

        if pos == 0:  # a prefill starts the sequence afresh
            self.caches[seq] = DynamicCache(config=self.config)
        cache = self.caches.get(seq)
        if cache is None:
            raise TracrError(f"sequence {seq} has no KV cache on this stage (its prefill "
                             "did not come here, or it ended)")
        return cache

    def _run(self, a: int, b: int, msg: dict, timed: bool) -> tuple[dict, list]:
        """Layers ``a + 1 .. b`` of one step of one sequence; per-layer ms if ``timed``
        (index 0 is the embedding, ``n + 1`` the norm and LM head)."""
        import torch
        from transformers.masking_utils import create_causal_mask

        seq, pos = int(msg["seq"]), int(msg["pos"])
        end = bool(msg.get("end"))
        if not self.holds(a, b):
            raise TracrError(f"{self.name or 'this stage'} holds {self.describe_held()}, "
                             f"not layers {a + 1}..{b}"
                             + (" with the embedding" if a == 0 else "")
                             + (" with the LM head" if b == self.n else ""),
                             hint="the route's cuts must match the layers each stage "
                                  "loaded at set-up")
        times: list[tuple[int, float]] = []
        t = _ns()
        if a == 0:
            ids = msg["ids"]
            if not isinstance(ids, torch.Tensor):
                ids = torch.tensor([list(ids)], dtype=torch.long)
            h = self.base.embed_tokens(ids.to(self.device or "cpu"))
            if timed:
                t, t0 = _ns(), t
                times.append((0, (t - t0) / 1e6))
        else:
            h = msg["h"].reshape(1, -1, self.hidden)  # from its grouped view (GROUP)
        cache = self._cache(seq, pos)
        steps = h.shape[1]
        position_ids = torch.arange(pos, pos + steps, device=h.device).unsqueeze(0)
        mask = create_causal_mask(config=self.config, inputs_embeds=h, attention_mask=None,
                                  cache=cache, position_ids=position_ids, layer_idx=a)
        pe = self.base.rotary_emb(h, position_ids=position_ids)
        for i in range(a, b):
            h = self.layers[i](h, attention_mask=mask, position_ids=position_ids,
                               cache=cache, use_cache=True, position_embeddings=pe)
            if timed:
                t, t0 = _ns(), t
                times.append((i + 1, (t - t0) / 1e6))
        kv = [*list(msg.get("kv") or []), self.kv_bytes(seq)]
        held = [*list(msg.get("held") or []), self.held_bytes()]
        rss = [*list(msg.get("rss") or []), peak_rss_bytes()]
        if end:
            self.drop(seq)
        if b < self.n:
            return {"h": self.grouped(h), "seq": seq, "pos": pos, "end": end, "kv": kv, "held": held,
                    "rss": rss, "reply": msg.get("reply", "token")}, times
        # the norm is per position: the last position alone is exactly what the full
        # model's last row would be
        logits = self.model.lm_head(self.base.norm(h[:, -1:, :]))[:, -1, :]
        out: dict[str, Any]
        if msg.get("reply") == "logits":
            out = {"logits": logits[0]}
        else:
            out = {"token": logits.argmax(dim=-1)}
        out["kv"] = torch.tensor(kv, dtype=torch.long)
        out["held"] = torch.tensor(held, dtype=torch.long)
        out["rss"] = torch.tensor(rss, dtype=torch.long)
        if timed:
            times.append((self.n + 1, (_ns() - t) / 1e6))
        return out, times


def next_token(outputs: dict) -> int:
    """The chosen token of a last stage's reply (its ``token``, or the greedy choice of
    its ``logits``): the reply's tensors in the order the stage returned them."""
    first = next(iter(outputs.values()))
    return int(first.argmax()) if first.numel() > 1 else int(first.reshape(-1)[0])
