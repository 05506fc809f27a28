"""The generate task: a token pipeline's measurement, on the head of a decoder chain."""

from __future__ import annotations

import logging
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.models.llm import load_tokenizer, prompt_ids
from experiment_design.runtime import heap
from experiment_design.runtime.chain import Route
from experiment_design.runtime.generation import generate, summarize
from experiment_design.tasks.base import Task, register_task

log = logging.getLogger(__name__)

#: the fixed prompt when the manifest gives none
DEFAULT_PROMPT = "Write a short poem about the sea."
#: a configuration row of this mode carries a generation's figures (``summary.json`` llm)
MODE = "generate"


@register_task("generate")
class Generate(Task):
    """Generate ``max_new_tokens`` greedy tokens (32) from ``prompt`` for ``sequences``
    sequences (1), ``in_flight`` at once (1), over the manifest's ``pipeline.chain`` cut
    at ``cuts`` (decoder-layer boundaries; ``[]`` with a one-member chain: the head
    alone). ``warmup`` unrecorded sequences of 4 tokens first (1). ``reply``: what the
    last stage sends back, ``token`` (the greedy id) or ``logits`` (the head chooses).

    Reports one configuration row of mode ``generate`` holding the figures of
    :func:`experiment_design.runtime.generation.summarize` and the tokens, which the
    observer writes to ``summary.json`` under ``llm``.
    """

    requires = "head"

    def run(self, participant: Any) -> None:
        """Warm up, generate, report."""
        self.check(participant)
        p = self.params
        pipe = participant.config.pipeline
        chain = list((pipe.chain if pipe else None) or [participant.instance])
        if chain[0] != participant.instance:
            raise TracrError(f"generate runs on the chain's head ({chain[0]}), "
                             f"not on {participant.instance}")
        cuts = [int(c) for c in (p.get("cuts") or [])]
        route = Route(tuple(chain[:len(cuts) + 1]), tuple(cuts))
        sm = participant.split_model
        if any(not 0 < c < sm.n for c in cuts):
            raise TracrError(f"cuts {cuts} must lie between 1 and {sm.n - 1} "
                             f"({sm.n} decoder layers)")
        n_new = int(p.get("max_new_tokens") or 32)
        count = int(p.get("sequences") or 1)
        in_flight = int(p.get("in_flight") or 1)
        reply = str(p.get("reply") or "token")
        model = participant.config.model.name
        seed = int(participant.config.seed)
        ids = prompt_ids(model, str(p.get("prompt") or DEFAULT_PROMPT),
                         tokens=int(p.get("prompt_tokens") or 16), seed=seed)
        stop = participant.stop_event
        warm = int(p.get("warmup", 1))
        if warm:
            generate(participant.head, route, [ids] * warm, 4, in_flight=in_flight,
                     reply=reply, first_seq=-warm - 1, stop=stop)

        _decode(model, ids[:1])  # the tokenizer, loaded before measuring
        # the tokenizer and the warm-up leave many objects: frozen now, a full collection
        # does not walk them between two tokens (a 240 ms pause on this machine)
        heap.settle()
        participant.progress(done=0, total=count * n_new, split=cuts[0] if cuts else None)
        log.info("generate: %d sequence(s) of %d tokens over %s, cuts %s", count, n_new,
                 "/".join(route.route), route.label)
        seqs = generate(participant.head, route, [ids] * count, n_new, in_flight=in_flight,
                        reply=reply, stop=stop)
        participant.progress(done=count * n_new)
        weights = [sm.weight_bytes(*route.bounds(h, sm.n)) for h in range(route.k)]
        figures = summarize(seqs, route, weights)
        figures.update(model=model, reply=reply, in_flight=in_flight,
                       prompt_ids=ids, tokens=[s.tokens for s in seqs])
        tok = _decode(model, seqs[0].tokens)
        if tok is not None:
            figures["text"] = tok
        participant.emit_config({"mode": MODE, "llm": figures})


def _decode(model: str, tokens: list[int]) -> str | None:
    tok = load_tokenizer(model)
    return None if tok is None else tok.decode(tokens)
