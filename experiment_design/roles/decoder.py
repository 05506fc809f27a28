"""Roles of a token pipeline: a language model cut at decoder-layer boundaries.

``llm-head`` (:class:`DecoderHead`) holds the prompt, runs the first layers (the
embedding included) and drives generation (the ``generate`` task); ``llm-stage``
(:class:`DecoderStage`) serves the later layers, the last one also the norm and the LM
head. Both build a :class:`~experiment_design.split.decoder.DecoderSplit` instead of a
traced split model; the chain's frames, relays and records
(:mod:`experiment_design.runtime.chain`) are the same as for any other model. Each
stage keeps the KV cache of its own layers per sequence.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from experiment_design.models.llm import get_llm_spec, load_llm
from experiment_design.protocol import SetupConfig, SetupInfo, Wiring
from experiment_design.roles.base import ParticipantService, codec_of
from experiment_design.roles.registry import register_role
from experiment_design.roles.stage import ChainMember, StageRole, require_channels
from experiment_design.runtime.chain import ChainHead

log = logging.getLogger(__name__)


class DecoderSetup(ParticipantService):
    """Set-up of a decoder model: load it from local files, wrap it as a DecoderSplit."""

    def on_setup(self, config: SetupConfig) -> SetupInfo:
        """Load the model named by the manifest (a registered language model), only the
        weights of the layers the observer assigned (``extra.llm_layers``); return its
        facts, with each layer's weight and KV bytes (``extra.llm``) for placement and
        what this stage holds."""
        import torch

        from experiment_design.split.decoder import DecoderSplit  # loads torch: see roles/base

        threads = config.threads or self.threads
        if threads:
            torch.set_num_threads(int(threads))
            self.threads = int(threads)
        name = config.model.name
        seed = int(config.seed)
        # the layers the observer assigned this stage (from the playbook's routes): only
        # their weights are loaded; none given, the whole model
        held = config.extra.get("llm_layers")
        layers = (int(held[0]), None if held[1] is None else int(held[1])) if held else None
        t0 = time.perf_counter()
        self.split_model = DecoderSplit(load_llm(name, seed=seed, layers=layers), name=name)
        load_s = time.perf_counter() - t0
        log.info("loaded %s (%s) in %.1f s", name, self.split_model.describe_held(), load_s)
        self.device = self._place_model(config)
        self.codec = codec_of(config)
        self.data_secret = bytes.fromhex(config.data_secret)
        sm = self.split_model
        spec = get_llm_spec(name)
        llm = {"model": name, "weights": "pretrained" if spec.pretrained else "random",
               "layers": sm.layer_facts(), "held": sm.describe_held(),
               "held_bytes": sm.held_bytes(), "load_s": round(load_s, 2)}
        return SetupInfo(
            mode=sm.mode, n_layers=sm.n, valid_splits=sm.valid_splits(),
            threads=torch.get_num_threads(), device=str(self.device),
            prepared={"side": None, "splits": 0, "ms": round(load_s * 1e3, 1)},
            extra={"extra": {"llm": llm}},  # on the wire as it always was: {"extra": {"llm"}}
        )


@register_role("llm-stage")
class DecoderStage(StageRole, DecoderSetup):
    """A stage of a token pipeline: serves decoder layers ``a + 1 .. b`` of every step
    sent to it, keeping each sequence's KV cache of those layers."""

    partners: dict[str, str] = {}


@register_role("llm-head")
class DecoderHead(ChainMember, DecoderSetup):
    """The head of a token pipeline: tokenizes the prompt, runs the first layers and
    feeds each chosen token back in (the ``generate`` task)."""

    partners: dict[str, str] = {}

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.head: Any = None

    def on_setup(self, config: SetupConfig) -> SetupInfo:
        """The model, and the chain's head side."""
        info = super().on_setup(config)
        self.head = ChainHead(self)
        return info

    def on_connect_partners(self, wiring: Wiring) -> dict:
        """One data channel per later stage."""
        out = super().on_connect_partners(wiring)
        require_channels(self)
        return out
