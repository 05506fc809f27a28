"""Token generation over a chain of decoder stages, and what it measured.

The head sends each step of a sequence into the route (the prompt once, the prefill;
then one token at a time, the decode) and the last stage answers with the greedy token,
which the head feeds back in. With ``in_flight > 1`` several sequences share the chain:
while a later stage decodes sequence A's token, the head works on sequence B's (each
stage's receive, compute and send threads, as in a pipelined chain). Every step is one
:class:`~experiment_design.runtime.chain.Completed` with every stage's record, so times
are each measured on the clock of the stage that spent them.

Figures (the LLM community's terms), from :func:`summarize`:

- ``ttft_ms``: time to first token, from the start of the head's prefill compute to the
  reply holding the first token (median over sequences).
- ``tpot_ms``: time per output token, the gap between two successive tokens of one
  sequence at the head (p50, p90, p99 over every gap of every sequence).
- ``tokens_per_s``: per sequence (median of its decoded tokens over its decode time)
  and in total (every generated token over the span of the whole generation).
- ``prefill_tokens_per_s``: prompt tokens over the prefill's time (median).
- per stage: median compute ms per decode token (and per layer), bytes sent per decode
  token at its outgoing cut, the weights it holds and its largest KV cache (as the stage
  reported them), their sum (``memory_bytes_peak``) and its process's peak resident
  memory (``rss_bytes_peak``, the runtime included).
"""

from __future__ import annotations

import itertools
import queue
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.runtime.chain import Completed, Route

_ids = itertools.count(1)
_POLL_S = 0.1


@dataclass
class Sequence:
    """One sequence: its prompt, the tokens chosen so far and each step as completed."""

    seq: int
    prompt: list[int]
    max_new_tokens: int
    reply: str = "token"
    tokens: list[int] = field(default_factory=list)
    steps: list[Completed] = field(default_factory=list)
    t_start: int = 0  # head clock, ns: the start of the prefill's compute
    token_ns: list[int] = field(default_factory=list)  # when each token arrived

    @property
    def done(self) -> bool:
        """All its tokens are chosen."""
        return len(self.tokens) >= self.max_new_tokens

    def message(self) -> dict[str, Any]:
        """The head's message for the next step (the prompt, or the last token)."""
        import torch

        feed = self.prompt if not self.tokens else self.tokens[-1:]
        pos = 0 if not self.tokens else len(self.prompt) + len(self.tokens) - 1
        return {"ids": torch.tensor([feed], dtype=torch.long), "seq": self.seq, "pos": pos,
                "end": len(self.tokens) + 1 >= self.max_new_tokens, "reply": self.reply}

    def take(self, c: Completed) -> None:
        """Record step ``c``'s reply: its token, its time."""
        # loads torch: not at tracr experiment validate
        from experiment_design.split.decoder import next_token

        if c.error:
            raise TracrError(f"sequence {self.seq}, token {len(self.tokens) + 1}: {c.error}")
        if not self.steps:
            self.t_start = c.record["t_start"]
        self.steps.append(c)
        self.tokens.append(next_token(c.outputs or {}))
        self.token_ns.append(c.t_done)


def generate(head: Any, route: Route, prompts: list[list[int]], max_new_tokens: int, *,
             in_flight: int = 1, reply: str = "token", first_seq: int = 0,
             stop: Any = None) -> list[Sequence]:
    """Generate ``max_new_tokens`` greedy tokens for each prompt over ``route`` (EOS does
    not stop a sequence: runs compare equal lengths); up to ``in_flight`` sequences in
    the chain at once. ``head`` is a :class:`~experiment_design.runtime.chain.ChainHead`;
    ``stop`` an Event that ends the run early (TracrError)."""
    seqs = [Sequence(first_seq + i, list(p), int(max_new_tokens), reply)
            for i, p in enumerate(prompts)]
    if in_flight <= 1 or route.k == 1:
        for s in seqs:
            while not s.done:
                if stop is not None and stop.is_set():
                    raise TracrError("stopped during generation")
                s.take(head.once(route, s.message(), next(_ids)))
        return seqs
    _interleaved(head, route, seqs, in_flight, stop)
    return seqs


def _interleaved(head: Any, route: Route, seqs: list[Sequence], in_flight: int,
                 stop: Any) -> None:
    """Several sequences in the chain: the head computes the next ready sequence's step
    while replies to the others are under way; a receiver thread feeds each chosen token
    back by putting its sequence on the ready queue."""
    # loads torch: not at tracr experiment validate
    from experiment_design.transport.errors import TransportError

    down = head.owner.downstream[route.route[1]]
    ready: queue.Queue = queue.Queue()
    waiting: dict[int, tuple[Sequence, Completed]] = {}
    lock = threading.Lock()
    failure: list[BaseException] = []
    halt = threading.Event()
    live = iter(seqs)

    def admit() -> None:
        s = next(live, None)
        if s is not None:
            ready.put(s)

    def receiver() -> None:
        while not halt.is_set():
            try:
                header, tensors, _ = down.recv()
            except (OSError, EOFError, TransportError) as exc:
                failure.append(exc)
                halt.set()
                return
            with lock:
                s, c = waiting.pop(int(header.get("id", -1)), (None, None))
            if s is None:
                continue
            head._finish(c, header, tensors)
            try:
                s.take(c)
            except TracrError as exc:
                failure.append(exc)
                halt.set()
                return
            if s.done:
                admit()
            else:
                ready.put(s)
            if all(x.done for x in seqs):
                return

    for _ in range(min(in_flight, len(seqs))):
        admit()
    t = threading.Thread(target=receiver, name="generate-recv", daemon=True)
    t.start()
    try:
        while not all(s.done for s in seqs):
            if halt.is_set() or (stop is not None and stop.is_set()):
                break
            try:
                s = ready.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            c = head._compute(route, s.message(), next(_ids))
            with lock:
                waiting[c.iid] = (s, c)
            head._send(c, pipe=True)
    finally:
        halt_wait = time.monotonic() + 30.0
        while t.is_alive() and not halt.is_set() and time.monotonic() < halt_wait:
            t.join(_POLL_S)
            if stop is not None and stop.is_set():
                break
        halt.set()
    if failure:
        raise TracrError(f"generation failed: {failure[0]}")
    if not all(s.done for s in seqs):
        raise TracrError("stopped during generation")


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


#: the last stage's reply: the token (or logits), then per stage its KV cache bytes, its
#: held weight bytes and its process's peak resident memory
_KV, _HELD, _RSS = 1, 2, 3


def _fact(c: Completed, hop: int, which: int) -> int | None:
    """Stage ``hop``'s figure ``which`` after step ``c``, as the last stage reported it."""
    vals = list((c.outputs or {}).values())
    if len(vals) <= which:
        return None
    row = vals[which].reshape(-1).tolist()
    return int(row[hop]) if hop < len(row) else None


def _per_layer(records: list[dict]) -> dict[str, float]:
    """Median ms per layer index over ``records``' ``layers`` ([index, ms] pairs)."""
    by: dict[int, list[float]] = {}
    for r in records:
        for i, ms in r.get("layers") or []:
            by.setdefault(int(i), []).append(float(ms))
    return {str(i): statistics.median(v) for i, v in sorted(by.items())}


def summarize(seqs: list[Sequence], route: Route, weight_bytes: list[int] | None = None
              ) -> dict[str, Any]:
    """The figures of a generation (see the module docstring), JSON-able."""
    gaps = [(b - a) / 1e6 for s in seqs for a, b in zip(s.token_ns, s.token_ns[1:], strict=False)]
    ttft = [(s.token_ns[0] - s.t_start) / 1e6 for s in seqs if s.token_ns]
    per_seq = [(len(s.token_ns) - 1) / ((s.token_ns[-1] - s.token_ns[0]) / 1e9)
               for s in seqs if len(s.token_ns) > 1 and s.token_ns[-1] > s.token_ns[0]]
    prefill = [len(s.prompt) / (t / 1e3) for s, t in zip(seqs, ttft, strict=False) if t > 0]
    t0 = min((s.t_start for s in seqs if s.token_ns), default=0)
    t1 = max((s.token_ns[-1] for s in seqs if s.token_ns), default=0)
    total = sum(len(s.tokens) for s in seqs)
    stages = []
    for hop in range(route.k):
        dec = [c.stages()[hop] for s in seqs for c in s.steps[1:] if len(c.stages()) > hop]
        pre = [s.steps[0].stages()[hop] for s in seqs
               if s.steps and len(s.steps[0].stages()) > hop]
        kv = [v for s in seqs for c in s.steps if (v := _fact(c, hop, _KV)) is not None]
        held = [v for s in seqs for c in s.steps if (v := _fact(c, hop, _HELD)) is not None]
        rss = [v for s in seqs for c in s.steps if (v := _fact(c, hop, _RSS)) is not None]
        a, b = (0, 0)
        if dec or pre:
            rec = (dec or pre)[0]
            a, b = int(rec.get("a", 0)), int(rec.get("b", 0))
        row = {
            "instance": route.route[hop], "layers": [a + 1, b] if b else None,
            "compute_ms_per_token": _median([float(r["compute_ms"]) for r in dec
                                             if r.get("compute_ms") is not None]),
            "prefill_compute_ms": _median([float(r["compute_ms"]) for r in pre
                                           if r.get("compute_ms") is not None]),
            "bytes_per_token": _median([float(r["bytes_raw"]) for r in dec
                                        if r.get("bytes_raw") is not None]),
            "encoded_bytes_per_token": _median([float(r["bytes_encoded"]) for r in dec
                                                if r.get("bytes_encoded") is not None]),
            "send_ms_per_token": _median([float(r["send_ms"]) for r in dec
                                          if r.get("send_ms") is not None]),
            "kv_cache_bytes_peak": max(kv) if kv else None,
            # per layer (0: the embedding, n + 1: norm and LM head), the median ms of a
            # decode step: what a placement over hosts would plan from
            "layer_ms_per_token": _per_layer(dec),
        }
        if held:  # as the stage itself holds them
            row["weight_bytes"] = max(held)
        elif weight_bytes is not None and hop < len(weight_bytes):
            row["weight_bytes"] = weight_bytes[hop]
        if "weight_bytes" in row:
            row["memory_bytes_peak"] = row["weight_bytes"] + (row["kv_cache_bytes_peak"] or 0)
        if rss:
            row["rss_bytes_peak"] = max(rss)
        stages.append(row)
    return {
        "route": list(route.route), "cuts": list(route.cuts), "sequences": len(seqs),
        "prompt_tokens": len(seqs[0].prompt) if seqs else 0,
        "new_tokens": seqs[0].max_new_tokens if seqs else 0,
        "ttft_ms": _median(ttft),
        "tpot_ms_p50": _pct(gaps, 0.5), "tpot_ms_p90": _pct(gaps, 0.9),
        "tpot_ms_p99": _pct(gaps, 0.99),
        "tokens_per_s_per_sequence": _median(per_seq),
        "tokens_per_s_total": total / ((t1 - t0) / 1e9) if t1 > t0 else None,
        "prefill_tokens_per_s": _median(prefill),
        "bytes_per_token_at_cuts": [st["bytes_per_token"] for st in stages[:-1]],
        "stages": stages,
    }
