"""The partitioner base class, the context it sees, and its registry.

A partitioner decides, per inference, where the model is cut. Split index k
means the edge runs layers 1..k and the cloud runs layers k+1..n.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from experiment_design.errors import TracrError
from experiment_design.params import Param
from experiment_design.registry import Registry


@dataclass
class PartitionContext:
    """Everything a partitioner may look at, as plain JSON-able data.

    ``layers`` are ``SplitModel.profile()`` rows, ``points`` the split points
    (index, layer, crossing_bytes, valid, ...), ``valid_splits`` the indices a
    sweep may use. The measured parts are filled by the observer when the
    partitioner asks for them via :attr:`Partitioner.needs`; ``fidelity`` is the head's
    start-up probe of (split, transport) pairs (``{items, seconds, pairs: [{split,
    transport, top1_agree, cosine_min, bytes, encode_ms, decode_ms, ...}]}``, see
    :func:`experiment_design.runtime.fidelity.probe`). ``scored_choices`` are the splits
    the partitioners scored after the sweep chose from the same start-up measurements (a
    racing sweep measures them beside its contenders, so each choice is scored on as many
    samples as the splits it is compared with).
    """

    layers: list[dict] = field(default_factory=list)
    points: list[dict] = field(default_factory=list)
    valid_splits: list[int] = field(default_factory=list)
    edge_profile: dict | None = None
    cloud_profile: dict | None = None
    network: dict | None = None
    measured: dict | None = None
    fidelity: dict | None = None
    scored_choices: list[int] | None = None

    def to_dict(self) -> dict:
        """Plain JSON form (what crosses the control channel)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> PartitionContext:
        """Inverse of :meth:`to_dict`; unknown keys are ignored."""
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        if known.get("measured"):
            known["measured"] = {int(k): v for k, v in known["measured"].items()}
        return cls(**known)


class Partitioner:
    """Base class for split-point policies; subclass it and register it.

    ``needs`` names the measurements the observer must gather before
    :meth:`setup` (any of ``edge_profile``, ``cloud_profile``, ``network``,
    ``measured``, ``fidelity``); cheap policies need none. A policy that needs
    ``fidelity`` has a ``probe_request()`` saying which pairs the head probes.

    Example::

        from experiment_design.partitioners import Partitioner, register_partitioner

        @register_partitioner("smallest-transfer")
        class SmallestTransfer(Partitioner):
            '''Always cut where the fewest bytes cross.'''

            def setup(self, ctx):
                super().setup(ctx)
                by_bytes = {p["index"]: p["crossing_bytes"] for p in ctx.points}
                self.k = min(ctx.valid_splits, key=lambda k: by_bytes[k])

            def next_split(self):
                return self.k

            def decision(self):
                return {"chosen": self.k, "why": "minimum crossing bytes"}
    """

    name: ClassVar[str] = ""
    needs: ClassVar[frozenset[str]] = frozenset()
    #: declared parameters, checked by ``tracr experiment validate`` (experiment_design.params)
    PARAMS: ClassVar[dict[str, Param]] = {}

    def __init__(self, **params: Any) -> None:
        self.params = dict(params)
        self.ctx: PartitionContext | None = None

    def setup(self, ctx: PartitionContext) -> None:
        """Called once at start-up, before any measured inference."""
        if not ctx.valid_splits:
            raise TracrError("The model has no valid split point.")
        self.ctx = ctx

    def next_split(self) -> int:
        """The split index for the next inference."""
        raise NotImplementedError

    def observe(self, split: int, row: dict) -> None:
        """The measured row of an inference this policy placed at ``split`` (the edge's
        ``inferences.csv`` row: ``e2e_ms``, ``edge_ms``, ``error``...). Default: ignored;
        adaptive policies learn from it."""

    def sweep_length(self) -> int | None:
        """How many inferences make one full pass of this policy, or None if open-ended."""
        return None

    def decision(self) -> dict:
        """Plain JSON: what it chose and why (inputs included)."""
        return {"name": self.name, "params": self.params}


#: name -> Partitioner subclass; every module of ``experiment_design.partitioners`` is
#: imported on lookup.
PARTITIONERS: Registry[type[Partitioner]] = Registry(
    "partitioner", ["experiment_design.partitioners"], base=Partitioner
)


def register_partitioner(name: str | None = None) -> Callable[[type[Partitioner]], type[Partitioner]]:
    """Class decorator: register a :class:`Partitioner` subclass under ``name``."""
    return PARTITIONERS.register(name)


def get_partitioner(name: str) -> type[Partitioner]:
    """The registered class for ``name`` (UnknownNameError lists valid names)."""
    return PARTITIONERS.get(name)


def create_partitioner(name: str, **params: Any) -> Partitioner:
    """Instantiate the partitioner registered as ``name`` with ``params``."""
    return PARTITIONERS.create(name, **params)


def list_partitioners() -> list[str]:
    """Names of all registered partitioners, sorted."""
    return PARTITIONERS.names()
