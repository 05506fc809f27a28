"""A decoder model holding only one stage's weights.

A stage that runs decoder layers ``a + 1 .. b`` needs those layers, plus the token
embedding on the head (``a == 0``) and the final norm and LM head on the last stage
(``b == n``). :func:`build_stage` builds the model's skeleton on the ``meta`` device (no
memory), then materializes only those parameters:

- from a GGUF file, dequantizing only the tensors the stage holds (``transformers``'
  own name mapping and tensor processors, as its loader uses them);
- for a config-only model, drawing each parameter from its own generator, seeded by the
  run's seed and the parameter's name, so every stage draws exactly the weights the
  unsplit model has (norm weights 1, biases 0, others normal with the config's
  ``initializer_range``).

Every other parameter stays on ``meta``: it costs nothing, yet its shape and size are
known, so the stage still reports every layer's facts for placement. A tied LM head
(``tie_word_embeddings``) is the embedding matrix: the last stage holds it as its LM head.
"""

from __future__ import annotations

import zlib
from typing import Any

from experiment_design.errors import TracrError

#: ``(a, b)``: layers ``a + 1 .. b`` (``b`` None: to the last); ``None``: the whole model
Held = tuple[int, int | None] | None


def held_names(model: Any, a: int, b: int) -> set[str]:
    """The state-dict names of the parameters a stage running layers ``a + 1 .. b``
    holds (``lm_head.weight`` for a tied head too)."""
    n = int(model.config.num_hidden_layers)
    keep = [f"model.layers.{i}." for i in range(a, b)]
    if a == 0:
        keep.append("model.embed_tokens.")
    if b == n:
        keep += ["model.norm.", "lm_head."]
    names = set()
    for name, _ in model.named_parameters(remove_duplicate=False):
        if any(name.startswith(k) for k in keep):
            names.add(name)
    return names


def _source_name(model: Any, name: str) -> str:
    """Where ``name``'s values come from: a tied LM head is the embedding matrix."""
    if name == "lm_head.weight" and getattr(model.config, "tie_word_embeddings", False):
        return "model.embed_tokens.weight"
    return name


def _set(model: Any, name: str, param: Any) -> None:
    owner, _, leaf = name.rpartition(".")
    model.get_submodule(owner)._parameters[leaf] = param


def _drawn(model: Any, names: set[str], seed: int) -> dict[str, Any]:
    """Seeded values of ``names`` (see the module docstring)."""
    import torch

    shapes = {n: p.shape for n, p in model.named_parameters(remove_duplicate=False)}
    std = float(getattr(model.config, "initializer_range", 0.02))
    out = {}
    for name in {_source_name(model, n) for n in names}:
        shape = shapes[name]
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape)
        elif name.endswith(".bias"):
            out[name] = torch.zeros(shape)
        else:
            g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
            out[name] = torch.empty(shape).normal_(0.0, std, generator=g)
    return out


def _dequantized(model: Any, path: str, names: set[str], parsed: dict | None
                 ) -> dict[str, Any]:
    """The tensors of ``names`` from the GGUF file at ``path``, dequantized to fp32; the
    file's other tensors are never dequantized. ``parsed``: the file's metadata, if read
    already (``load_gguf_checkpoint(path, return_tensors=False)``)."""
    import numpy as np
    import torch
    from gguf import GGUFReader, dequantize
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        load_gguf_checkpoint,
    )

    if parsed is None:
        parsed = load_gguf_checkpoint(path, return_tensors=False)
    arch = model.config.model_type
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=parsed.get("config", {}))
    mapping = get_gguf_hf_weights_map(model, processor)
    wanted = {_source_name(model, n) for n in names}
    out: dict[str, Any] = {}
    for tensor in GGUFReader(path).tensors:
        if mapping.get(tensor.name) not in wanted:
            continue
        weights = dequantize(tensor.data, tensor.tensor_type)
        result = processor.process(weights=weights, name=tensor.name,
                                   tensor_key_mapping=mapping, parsed_parameters=parsed)
        hf = mapping.get(result.name, mapping[tensor.name])
        w = result.weights  # a fresh array when dequantized; a view of the file if not
        if not (w.flags.writeable and w.flags.c_contiguous):
            w = np.copy(w)
        out[hf] = torch.from_numpy(w).to(torch.float32)
    missing = wanted - set(out)
    if missing:
        raise TracrError(f"{path}: no tensors for {sorted(missing)[:4]}")
    return out


def build_stage(config: Any, layers: Held, *, seed: int = 0, gguf_path: str | None = None,
                gguf_meta: dict | None = None) -> Any:
    """The causal LM of ``config`` holding only the weights of ``layers`` (``(a, b)``:
    decoder layers ``a + 1 .. b``; ``None``: all), the rest on ``meta``; in eval mode.
    Weights from the GGUF file ``gguf_path`` (its metadata ``gguf_meta`` if read), else
    drawn from ``seed``."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    base = model.model
    # the rotary embedding's buffers are computed, not loaded: built for real
    base.rotary_emb = type(base.rotary_emb)(config=model.config)
    n = int(model.config.num_hidden_layers)
    a, b = layers if layers is not None else (0, n)
    b = n if b is None else b
    names = held_names(model, a, b)
    values = (_dequantized(model, gguf_path, names, gguf_meta) if gguf_path
              else _drawn(model, names, seed))
    params = {k: torch.nn.Parameter(v, requires_grad=False) for k, v in values.items()}
    for name in sorted(names):  # a tied head and embedding: one Parameter, both places
        _set(model, name, params[_source_name(model, name)])
    return model.eval()


def held_range(model: Any) -> tuple[int, int]:
    """The decoder layers ``(a, b)`` whose weights ``model`` holds (``a + 1 .. b``)."""
    layers = list(model.model.layers)
    real = [i for i, m in enumerate(layers)
            if all(not p.is_meta for p in m.parameters())]
    if not real:
        return (0, 0)
    return real[0], real[-1] + 1
