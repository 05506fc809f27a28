"""What a token pipeline adds to ``summary.json``: the ``llm`` section.

The head's ``generate`` task reports its figures as a configuration row of mode
``generate`` (see :mod:`experiment_design.runtime.generation` for what each means); they
are a run's figures, not a row of ``configs.csv``, so they are taken out of the rows
here and kept for the summary.
"""

from __future__ import annotations

from typing import Any

from app_api import lab
from experiment_design.errors import TracrError
from experiment_design.models.llm import is_llm, llm_skeleton
from experiment_design.split.decoder import DecoderSplit
from experiment_design.tasks.generate import MODE


def take_generations(state: Any, configs: list[dict]) -> list[dict]:
    """Move every generation in ``configs`` into ``state.extra['llm']`` (the first one; a
    later one goes to its ``more`` list); return the other rows."""
    rest = []
    for c in configs:
        if c.get("mode") != MODE:
            rest.append(c)
            continue
        figures = dict(c.get("llm") or {})
        if "llm" not in state.extra:
            state.extra["llm"] = figures
        else:
            state.extra["llm"].setdefault("more", []).append(figures)
    return rest


def stage_layers(manifest: Any) -> dict[str, list]:
    """Which decoder layers each member of a token pipeline must hold, from the
    playbook's ``generate`` tasks and ``pipeline.chain``: ``{instance: [a, b]}`` (layers
    ``a + 1 .. b``; ``b`` None: to the last layer), the smallest range that covers every
    route a ``generate`` task sends it. A member no generate task reaches holds every
    layer (it may be given a route later)."""
    chain = list((manifest.pipeline or {}).get("chain") or [])
    ranges: dict[str, list] = {}
    for instance, tasks in (manifest.playbook or {}).items():
        for step in tasks or []:
            if not isinstance(step, dict) or step.get("task") != MODE:
                continue
            cuts = [int(c) for c in ((step.get("params") or {}).get("cuts") or [])]
            route = (chain or [instance])[:len(cuts) + 1]
            bounds = [0, *cuts, None]
            for hop, member in enumerate(route):
                a, b = bounds[hop], bounds[hop + 1]
                if member in ranges:
                    lo, hi = ranges[member]
                    a = min(a, lo)
                    b = None if b is None or hi is None else max(b, hi)
                ranges[member] = [a, b]
    return ranges


def llm_setup(manifest: Any, instance: str) -> dict:
    """The ``extra`` of ``instance``'s set-up: for a language model, the layers it holds
    (``llm_layers``, see :func:`stage_layers`); nothing for any other model."""
    if not is_llm((manifest.model or {}).get("name")):
        return {}
    held = stage_layers(manifest).get(instance)
    return {"llm_layers": held} if held is not None else {}


#: the context a memory check sizes each stage's KV cache for (tokens)
CHECK_CONTEXT = 512


def check_memory(manifest: Any) -> None:
    """Refuse, before any device is touched, a token pipeline whose stage would not fit
    the memory cap of the lab host it runs on (``tracr lab up --memory``): each stage's
    weights (only its own layers: :func:`stage_layers`) and its layers' KV cache for
    :data:`CHECK_CONTEXT` tokens, against the cap, with the figures. What Python, torch
    and ``transformers`` take beside them is not counted: a stage that passes may still
    not fit, one that fails cannot."""
    import importlib.util

    name = (manifest.model or {}).get("name")
    if not is_llm(name) or importlib.util.find_spec("transformers") is None:
        return

    state = lab.load_state() or {}
    caps = {h["name"]: int(h["memory_bytes"]) for h in state.get("hosts", [])
            if h.get("memory_bytes")}
    devices = {i["name"]: i.get("device") for i in manifest.participant_instances}
    ranges = {inst: r for inst, r in stage_layers(manifest).items()
              if devices.get(inst) in caps}
    if not ranges:
        return

    sm = DecoderSplit(llm_skeleton(name), name=name)
    kv = [f["kv_bytes_per_token"] for f in sm.layer_facts()]
    over = []
    for inst, (a, b) in sorted(ranges.items()):
        b = sm.n if b is None else int(b)
        need = sm.weight_bytes(a, b) + sum(kv[a:b]) * CHECK_CONTEXT
        cap = caps[devices[inst]]
        if need > cap:
            over.append(f"{inst} on {devices[inst]} (layers {a + 1}..{b}) needs "
                        f"{need / 1e6:.1f} MB, cap {cap / 1e6:.1f} MB")
    if over:
        raise TracrError(
            f"{name} does not fit the lab's memory caps: " + "; ".join(over)
            + f" (weights and a {CHECK_CONTEXT}-token KV cache, before the runtime's own)",
            hint="cut elsewhere (experiment_design.partitioners.llm_placement places it "
                 "within the caps), add stages, or raise the caps (tracr lab up --memory)")
