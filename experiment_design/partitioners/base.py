"""The partitioner base class, the context it sees, and its registry.

A partitioner decides, per inference, where the model is cut. Split index k
means the edge runs layers 1..k and the cloud runs layers k+1..n.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from experiment_design.errors import TracrError
from experiment_design.params import Param
from experiment_design.protocol import Measurements, SetupInfo
from experiment_design.registry import Registry


@dataclass(init=False)
class PartitionContext:
    """Everything a partitioner may look at: the model as the head built it (``info``, its
    :class:`~experiment_design.protocol.SetupInfo`) and what the observer measured for the
    partitioner's :attr:`Partitioner.needs` (``measurements``, a
    :class:`~experiment_design.protocol.Measurements`), both held as messages: each
    context has its own shallow copy of the two, so setting an attribute of one context
    (``dataclasses.replace`` makes another) changes no other.

    A partitioner reads them through attributes: ``layers`` are ``SplitModel.profile()``
    rows, ``points`` the split points (index, layer, crossing_bytes, valid, ...),
    ``valid_splits`` the indices a sweep may use (the three from ``info``);
    ``edge_profile``, ``cloud_profile``, ``network``, ``measured`` (split -> ms, keys as
    ints) and ``scored_choices`` (the splits the partitioners scored after the sweep chose
    from the same start-up measurements: a racing sweep measures them beside its
    contenders, so each choice is scored on as many samples as the splits it is compared
    with) from ``measurements``. ``fidelity`` is the head's start-up probe of (split,
    transport) pairs (``{items, seconds, pairs: [{split, transport, top1_agree,
    cosine_min, bytes, encode_ms, decode_ms, ...}]}``, see
    :func:`experiment_design.runtime.fidelity.probe`).

    Built from the messages (the head) or, as tests and scoring do, from the attributes
    by keyword: ``PartitionContext(layers=..., points=..., valid_splits=..., network=...)``.
    """

    info: SetupInfo
    measurements: Measurements
    fidelity: dict | None

    def __init__(self, layers: list[dict] | None = None, points: list[dict] | None = None,
                 valid_splits: list[int] | None = None, edge_profile: dict | None = None,
                 cloud_profile: dict | None = None, network: dict | None = None,
                 measured: dict | None = None, fidelity: dict | None = None,
                 scored_choices: list[int] | None = None, *, info: SetupInfo | None = None,
                 measurements: Measurements | None = None) -> None:
        model = {k: v for k, v in (("profile", layers), ("points", points),
                                   ("valid_splits", valid_splits)) if v is not None}
        measure = {k: v for k, v in (("edge_profile", edge_profile),
                                     ("cloud_profile", cloud_profile), ("network", network),
                                     ("measured", measured),
                                     ("scored_choices", scored_choices)) if v is not None}
        # a shallow copy of each message (no dict round trip), with any keyword given
        # beside it as an override
        self.info = replace(info, **model) if info is not None else SetupInfo(**model)
        m = (replace(measurements, **measure) if measurements is not None
             else Measurements(**measure))
        if m.measured and any(not isinstance(k, int) for k in m.measured):
            m = replace(m, measured={int(k): v for k, v in m.measured.items()})  # JSON keys
        self.measurements = m
        self.fidelity = fidelity

    layers = property(lambda self: self.info.profile,
                      lambda self, v: setattr(self.info, "profile", v))
    points = property(lambda self: self.info.points,
                      lambda self, v: setattr(self.info, "points", v))
    valid_splits = property(lambda self: self.info.valid_splits,
                            lambda self, v: setattr(self.info, "valid_splits", v))
    edge_profile = property(lambda self: self.measurements.edge_profile,
                            lambda self, v: setattr(self.measurements, "edge_profile", v))
    cloud_profile = property(lambda self: self.measurements.cloud_profile,
                             lambda self, v: setattr(self.measurements, "cloud_profile", v))
    network = property(lambda self: self.measurements.network,
                       lambda self, v: setattr(self.measurements, "network", v))
    measured = property(lambda self: self.measurements.measured,
                        lambda self, v: setattr(self.measurements, "measured", v))
    scored_choices = property(lambda self: self.measurements.scored_choices,
                              lambda self, v: setattr(self.measurements, "scored_choices", v))

    def to_dict(self) -> dict:
        """Plain JSON form (what the observer keeps to score partitioners with)."""
        return {k: copy.deepcopy(getattr(self, k)) for k in CONTEXT_KEYS}

    @classmethod
    def from_dict(cls, d: dict) -> PartitionContext:
        """Inverse of :meth:`to_dict`; unknown keys are ignored."""
        return cls(**{k: d[k] for k in CONTEXT_KEYS if k in d})


#: the attributes of a :class:`PartitionContext`, in the order of its plain JSON form
CONTEXT_KEYS = ("layers", "points", "valid_splits", "edge_profile", "cloud_profile", "network",
                "measured", "fidelity", "scored_choices")


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
