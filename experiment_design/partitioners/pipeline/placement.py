"""A placement (stages on devices), its predicted times, and how two compare."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from experiment_design.errors import TracrError
from experiment_design.partitioners.pipeline.facts import DeviceFacts

OBJECTIVES = ("throughput", "latency")
#: relative tolerance under which two predicted times count as equal (ties go to the
#: simpler placement: fewer devices, the source alone first).
REL_TOL = 1e-9

# ----- placements -------------------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    """``device`` runs layers ``first..last`` (cut ``first - 1`` before, cut ``last``
    after); ``Stage(source, 1, 0)`` is the source only forwarding the input."""

    device: str
    first: int
    last: int

    @property
    def layers(self) -> int:
        """How many layers the stage runs (0 for a forwarding source)."""
        return self.last - self.first + 1


@dataclass(frozen=True)
class Placement:
    """A planned pipeline and its predictions (per stage: ``compute_ms``, ``transfer_ms``
    of what it sends on, ``memory_bytes`` of its parameters, ``overhead_ms`` of its
    device's part in the chain; empty: none)."""

    stages: tuple[Stage, ...]
    objective: str
    predicted_throughput_per_s: float
    predicted_latency_ms: float
    compute_ms: tuple[float, ...]
    transfer_ms: tuple[float, ...]
    memory_bytes: tuple[int, ...]
    reason: str = ""
    batch: int = 1
    overhead_ms: tuple[float, ...] = ()

    @property
    def cuts(self) -> tuple[int, ...]:
        """The boundaries between consecutive stages (cut 0 for a forwarding source)."""
        return tuple(s.last for s in self.stages[:-1])

    @property
    def chain(self) -> tuple[str, ...]:
        """The devices in stage order."""
        return tuple(s.device for s in self.stages)

    @property
    def stage_ms(self) -> tuple[float, ...]:
        """Each stage's time in the objective's mode (:func:`stage_time`)."""
        ovh = self.overhead_ms or (0.0,) * len(self.compute_ms)
        pipelined = self.objective == "throughput"
        return tuple(stage_time(c, o, t, pipelined)
                     for c, o, t in zip(self.compute_ms, ovh, self.transfer_ms, strict=True))

    @property
    def bottleneck_ms(self) -> float:
        """The slowest stage: the pipeline's period."""
        return max(self.stage_ms)

    @property
    def predicted_samples_per_s(self) -> float:
        """Throughput in samples (``batch`` per pass)."""
        return self.predicted_throughput_per_s * self.batch

    @property
    def computing_devices(self) -> int:
        """How many devices run at least one layer."""
        return sum(1 for s in self.stages if s.layers > 0)

    def to_dict(self) -> dict:
        """Plain JSON form (with the derived ``cuts``, ``chain`` and ``bottleneck_ms``)."""
        return {
            "stages": [asdict(s) for s in self.stages],
            "cuts": list(self.cuts),
            "chain": list(self.chain),
            "objective": self.objective,
            "predicted_throughput_per_s": self.predicted_throughput_per_s,
            "predicted_latency_ms": self.predicted_latency_ms,
            "bottleneck_ms": self.bottleneck_ms,
            "compute_ms": list(self.compute_ms),
            "transfer_ms": list(self.transfer_ms),
            "memory_bytes": list(self.memory_bytes),
            "overhead_ms": list(self.overhead_ms),
            "reason": self.reason,
            "batch": self.batch,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> Placement:
        """Inverse of :meth:`to_dict` (the derived fields are ignored)."""
        return cls(
            stages=tuple(Stage(s["device"], int(s["first"]), int(s["last"]))
                         for s in d["stages"]),
            objective=d["objective"],
            predicted_throughput_per_s=float(d["predicted_throughput_per_s"]),
            predicted_latency_ms=float(d["predicted_latency_ms"]),
            compute_ms=tuple(float(v) for v in d["compute_ms"]),
            transfer_ms=tuple(float(v) for v in d["transfer_ms"]),
            memory_bytes=tuple(int(v) for v in d["memory_bytes"]),
            reason=d.get("reason", ""),
            batch=int(d.get("batch") or 1),
            overhead_ms=tuple(float(v) for v in d.get("overhead_ms") or ()),
        )


def _at_least(ps: Sequence[float], m: int) -> float:
    """The probability that at least ``m`` of independent events of probabilities ``ps``
    happen (a Poisson-binomial tail)."""
    if m <= 0:
        return 1.0
    dist = [1.0] + [0.0] * len(ps)  # dist[k]: k of the events so far
    for p in ps:
        for k in range(len(dist) - 1, 0, -1):
            dist[k] = dist[k] * (1 - p) + dist[k - 1] * p
        dist[0] *= 1 - p
    return sum(dist[m:])


def contention_gains(devices: Sequence[DeviceFacts], work_ms: Sequence[float],
                     bottleneck_ms: float) -> list[float]:
    """How much faster than planned (every limited host busy) each stage's CPU work runs,
    given how busy the plan keeps the other hosts of its machine.

    The lab's hosts share the machine's CPUs: three hosts of 0.6 core on two CPUs got
    0.54-0.57 of a core each with all three busy, 0.60 alone. A stage's host loses share
    only while at least ``machine_cpus`` other hosts want a CPU at once. A host j runs
    ``work_ms[j] / uncontended_j`` ms per pass at its alone share, so it wants its quota
    for the fraction ``u_j`` = that / ``bottleneck_ms`` of the time (at most 1) and a CPU
    for ``u_j * cores_j``; with those as independent chances, the contended fraction is
    P(at least machine_cpus of the others want a CPU), over its value with every other
    host busy, and the gain is ``1 + (uncontended - 1) * (1 - that fraction)``. Measured
    on AlexNet at 0.6 core (cuts 16/17): the stages after the head were busy 54% and 31%
    of the time and the head ran at 0.596 of a core, planned at the all-busy 0.56.
    Devices without ``cores`` (not limited) neither gain nor count."""
    limited = [i for i, d in enumerate(devices) if d.cores is not None]
    gains = [1.0] * len(devices)
    if not limited or bottleneck_ms <= 0:
        return gains
    want = {i: min(1.0, work_ms[i] / devices[i].uncontended / bottleneck_ms) * devices[i].cores
            for i in limited}
    for i in limited:
        d = devices[i]
        others = [j for j in limited if j != i]
        m = d.machine_cpus if d.machine_cpus is not None else len(others)
        full = _at_least([min(1.0, devices[j].cores) for j in others], m)
        share = _at_least([min(1.0, want[j]) for j in others], m) / full if full > 0 else 0.0
        gains[i] = 1.0 + (d.uncontended - 1.0) * (1.0 - min(1.0, share))
    return gains


def stage_time(compute: float, overhead: float, transfer: float, pipelined: bool) -> float:
    """A stage's time per pass: with passes in flight (``pipelined``, the throughput
    objective) its sending thread overlaps the next pass's compute, so the slower of its
    CPU work (compute + overhead) and its outgoing transfer; one pass at a time (the
    latency objective), their sum."""
    return max(compute + overhead, transfer) if pipelined else compute + overhead + transfer


def check_objective(objective: str) -> str:
    """``objective`` if it is one of ``OBJECTIVES``; a TracrError naming them otherwise."""
    if objective not in OBJECTIVES:
        raise TracrError(f"Unknown pipeline objective '{objective}'.",
                         hint=f"Use one of {list(OBJECTIVES)}.")
    return objective


def _primary(p: Placement, objective: str) -> float:
    return p.bottleneck_ms if objective == "throughput" else p.predicted_latency_ms


def _secondary(p: Placement, objective: str) -> float:
    return p.predicted_latency_ms if objective == "throughput" else p.bottleneck_ms


def _lt(x: float, y: float) -> bool:
    """x < y by more than the tolerance."""
    return x < y - REL_TOL * max(abs(x), abs(y), 1e-12)


def better(p: Placement, q: Placement, objective: str) -> bool:
    """True when ``p`` is strictly better than ``q``: a lower primary time (bottleneck for
    throughput, latency for latency), or the same one and a lower secondary time."""
    pp, qp = _primary(p, objective), _primary(q, objective)
    if _lt(pp, qp):
        return True
    return not _lt(qp, pp) and _lt(_secondary(p, objective), _secondary(q, objective))


def best_of(placements: Iterable[Placement], objective: str) -> Placement | None:
    """The best placement by :func:`better`; ties keep the earliest one."""
    best = None
    for p in placements:
        if best is None or better(p, best, objective):
            best = p
    return best

