"""What the planner knows: each device's layer times and limits, each link, the model."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Union

from experiment_design.errors import TracrError


# ----- facts ------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceFacts:
    """One device: ``layer_ms`` of layers 1..n there (at the run's batch; any sequence,
    kept as a tuple), how many bytes of parameters it may hold (``memory_bytes``,
    None = unlimited), and what taking part in a chain costs it per inference beside
    its layers, in a plan of two or more stages: ``overhead_ms`` per stage (receiving,
    relaying the reply, the stage's threads) and ``byte_ms`` per byte the stage receives
    or sends (copying, framing, the codec, encryption).

    A device that shares a machine's CPUs with other limited devices (lab hosts under
    CPU quotas) has its times for when every one of them is busy, and ``cores``: the
    share of a core it gets alone; ``uncontended``: how much faster it runs when the
    others leave it its share (the alone share over the all-busy one); ``machine_cpus``:
    the CPUs they share (see :func:`contention_gains`)."""

    name: str
    layer_ms: tuple[float, ...]
    memory_bytes: int | None = None
    overhead_ms: float = 0.0
    byte_ms: float = 0.0
    cores: float | None = None
    uncontended: float = 1.0
    machine_cpus: int | None = None

    def __post_init__(self) -> None:
        ms = tuple(float(v) for v in self.layer_ms)
        if any(not math.isfinite(v) or v < 0 for v in ms):
            raise TracrError(f"device {self.name}: layer times must be finite and >= 0.")
        object.__setattr__(self, "layer_ms", ms)
        if self.memory_bytes is not None:
            object.__setattr__(self, "memory_bytes", int(self.memory_bytes))
        for key in ("overhead_ms", "byte_ms"):
            v = float(getattr(self, key))
            if not math.isfinite(v) or v < 0:
                raise TracrError(f"device {self.name}: {key} must be finite and >= 0.")
            object.__setattr__(self, key, v)
        if self.cores is not None:
            cores = float(self.cores)
            if not math.isfinite(cores) or cores <= 0:
                raise TracrError(f"device {self.name}: cores must be finite and > 0.")
            object.__setattr__(self, "cores", cores)
        gain = float(self.uncontended)
        if not math.isfinite(gain) or gain < 1:
            raise TracrError(f"device {self.name}: uncontended must be finite and >= 1.")
        object.__setattr__(self, "uncontended", gain)
        if self.machine_cpus is not None:
            object.__setattr__(self, "machine_cpus", max(1, int(self.machine_cpus)))

    def to_dict(self) -> dict:
        """Plain JSON form."""
        out = {"name": self.name, "layer_ms": list(self.layer_ms),
               "memory_bytes": self.memory_bytes, "overhead_ms": self.overhead_ms,
               "byte_ms": self.byte_ms}
        if self.cores is not None:
            out.update(cores=self.cores, uncontended=self.uncontended,
                       machine_cpus=self.machine_cpus)
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> DeviceFacts:
        """Inverse of :meth:`to_dict`."""
        return cls(str(d["name"]), tuple(d["layer_ms"]), d.get("memory_bytes"),
                   float(d.get("overhead_ms") or 0.0), float(d.get("byte_ms") or 0.0),
                   d.get("cores"), float(d.get("uncontended") or 1.0), d.get("machine_cpus"))


@dataclass(frozen=True)
class LinkFacts:
    """A directed link: bandwidth in bytes/s and round-trip time in ms."""

    bandwidth_Bps: float
    rtt_ms: float = 0.0

    def __post_init__(self) -> None:
        if not (float(self.bandwidth_Bps) > 0 and math.isfinite(float(self.bandwidth_Bps))):
            raise TracrError(f"A link's bandwidth must be > 0 B/s, got {self.bandwidth_Bps}.")
        if not float(self.rtt_ms) >= 0:
            raise TracrError(f"A link's rtt must be >= 0 ms, got {self.rtt_ms}.")

    def transfer_ms(self, nbytes: float) -> float:
        """One-way time of ``nbytes``: bytes / bandwidth + half the round trip, in ms."""
        return nbytes / float(self.bandwidth_Bps) * 1000.0 + float(self.rtt_ms) / 2.0

    def to_dict(self) -> dict:
        """Plain JSON form."""
        return asdict(self)


#: ``{(from, to): LinkFacts}`` or ``f(from, to) -> LinkFacts | None``; a missing link makes
#: that ordered pair unusable.
Links = Union[Mapping[tuple[str, str], LinkFacts], Callable[[str, str], Union[LinkFacts, None]]]


def full_mesh(names: Iterable[str], link_facts: LinkFacts) -> dict[tuple[str, str], LinkFacts]:
    """The same link between every ordered pair of ``names`` (one probed network)."""
    names = list(names)
    return {(a, b): link_facts for a in names for b in names if a != b}


@dataclass(frozen=True)
class ModelFacts:
    """What the planner needs of a model with ``n`` layers.

    ``crossing_bytes[k]`` and ``valid[k]`` are those of cut k = 0..n (cut 0: the
    input); ``param_bytes[j-1]`` belongs to layer j; ``output_bytes`` is what the last
    stage returns; ``batch`` is the number of samples in one pass (the byte counts and
    layer times are for that batch).
    """

    n: int
    crossing_bytes: tuple[int, ...]
    valid: tuple[bool, ...]
    param_bytes: tuple[int, ...]
    output_bytes: int
    batch: int = 1

    def __post_init__(self) -> None:
        for name, want in (("crossing_bytes", self.n + 1), ("valid", self.n + 1),
                           ("param_bytes", self.n)):
            if len(getattr(self, name)) != want:
                raise TracrError(f"ModelFacts.{name} has {len(getattr(self, name))} entries, "
                                 f"expected {want} for n = {self.n}.")
        if self.n < 1 or self.batch < 1:
            raise TracrError(f"ModelFacts needs n >= 1 and batch >= 1 (n={self.n}, "
                             f"batch={self.batch}).")
        object.__setattr__(self, "crossing_bytes", tuple(int(v) for v in self.crossing_bytes))
        object.__setattr__(self, "valid", tuple(bool(v) for v in self.valid))
        object.__setattr__(self, "param_bytes", tuple(int(v) for v in self.param_bytes))

    @classmethod
    def from_rows(cls, layers: Sequence[Mapping], points: Sequence[Mapping],
                  batch: int = 1) -> ModelFacts:
        """From ``SplitModel.profile()`` rows and the split points (``PartitionContext``'s
        ``layers`` and ``points``); the output is the last layer's ``output_bytes``."""
        n = len(layers)
        by_index = {int(p["index"]): p for p in points}
        if sorted(by_index) != list(range(n + 1)):
            raise TracrError(f"The model has {n} layers but its split points are not the "
                             f"cuts 0..{n}.")
        last = layers[-1]
        out = last.get("output_bytes")
        return cls(
            n=n,
            crossing_bytes=tuple(int(by_index[k].get("crossing_bytes") or 0)
                                 for k in range(n + 1)),
            valid=tuple(bool(by_index[k].get("valid", True)) for k in range(n + 1)),
            param_bytes=tuple(int(r.get("param_bytes") or 0) for r in layers),
            output_bytes=int(out if out is not None else by_index[n].get("crossing_bytes") or 0),
            batch=batch,
        )

    def to_dict(self) -> dict:
        """Plain JSON form."""
        return {"n": self.n, "crossing_bytes": list(self.crossing_bytes),
                "valid": list(self.valid), "param_bytes": list(self.param_bytes),
                "output_bytes": self.output_bytes, "batch": self.batch}

    @classmethod
    def from_dict(cls, d: Mapping) -> ModelFacts:
        """Inverse of :meth:`to_dict`; ``{"layers": rows, "points": rows}`` works too."""
        if "layers" in d:
            return cls.from_rows(d["layers"], d["points"], batch=int(d.get("batch") or 1))
        return cls(int(d["n"]), tuple(d["crossing_bytes"]), tuple(d["valid"]),
                   tuple(d["param_bytes"]), int(d["output_bytes"]), int(d.get("batch") or 1))

    def interior_cuts(self) -> list[int]:
        """The valid cuts 0 < k < n: where two computing stages may meet."""
        return [k for k in range(1, self.n) if self.valid[k]]

