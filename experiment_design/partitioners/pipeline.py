"""Placement planning for pipelines over k >= 2 devices: pure functions, no runtime.

A pipeline is a chain of stages. Stage 1 runs on the **source**, the device that
holds the inputs; stage i runs the contiguous layers ``first..last`` on its own
device (cut ``a = first - 1`` before it, cut ``b = last`` after it) and sends the
tensors of cut ``b`` straight to stage i+1; the last stage sends the model's
output back to the source. Each device takes part at most once.

**The source's stage may be empty** (``Stage(source, 1, 0)``): the source only
sends the raw input (cut 0) on and receives the output. Every other stage runs
at least one layer. So the single-device placements are the source running
everything (one stage) and the source forwarding the input to one device that
runs everything (two stages, the first empty).

**Cost model.** For stage i on device d_i running layers a_i+1..b_i::

    compute_i  = sum of d_i's layer_ms over a_i+1..b_i
    overhead_i = d_i's overhead_ms (receiving, relaying the reply, the stage's
                 threads) + d_i's byte_ms * (bytes it receives + bytes it sends),
                 when the plan has two or more stages
    transfer_i = crossing_bytes[b_i] / bandwidth(d_i, d_i+1) + rtt(d_i, d_i+1) / 2
                 (the last stage: output_bytes over the link back to the source;
                 nothing when the last stage is the source itself)
    stage_i    = max(compute_i + overhead_i, transfer_i)   throughput objective
               = compute_i + overhead_i + transfer_i        latency objective

    bottleneck = max_i stage_i          throughput = 1000 / bottleneck  (passes/s)
    latency    = sum_i (compute_i + overhead_i + transfer_i)  (one pass alone)

Devices that share a machine's CPUs under quotas (lab hosts) have their sustained times
for every one of them busy; for the throughput objective a stage's compute and overhead
are divided by its gain from the others' idle time (:func:`contention_gains`, solved
with the bottleneck as a fixed point).

With passes in flight a stage sends on its own thread while it computes the next
pass, so its period is the slower of its CPU work and its outgoing transfer; one
pass at a time, a stage computes, then sends (:func:`stage_time`). A receive is
charged to the receiver through its overhead. Measured in a 3-host lab (AlexNet,
0.6 core, 32 MB/s): the head ran layers 1..13 and sent 37 KB (1.2 ms on the wire)
every 18.9-22.9 ms in eight runs, where the sum predicted 23.3-24.5 ms. The overlap
needs the CPU a byte really costs: the link probe's 0.5-1.5 ns/B made cuts with 300
KB crossing look free, and they ran 46-56/s against 71-73/s predicted; the overhead
probe now fits it on the chain (3.5-4.9 ns/B, ``EdgeRole.probe_overhead``).

The throughput is the bound of a pipeline with enough passes in flight; a pass is
one batch of ``ModelFacts.batch`` samples (``layer_ms`` and the byte counts must be for that
batch). Memory: the ``param_bytes`` of a stage's layers must fit its device's
``memory_bytes`` (None = unlimited); activations are not counted.

**Boundaries.** Only valid cuts (``ModelFacts.valid``) separate two stages: an
interior cut 0 < b < n, or cut 0 when the source's stage is empty. Cut n is never
a boundary (the output always goes back to the source).

**Algorithms.** :func:`plan_pipeline` is a dynamic program in the style of
PipeEdge over states (layers done, set of devices used, device of the next
stage): exact for both objectives, exponential in the number of devices
(``MAX_DEVICES``), quadratic in the number of valid cuts. For throughput it
first finds the smallest bottleneck, then, among the plans that reach it, the one
with the least sum of squared stage times (the most room on the other stages). It
never returns a plan that loses to the best single device.
:func:`enumerate_placements` is the exhaustive sweep of one fixed device chain
(the oracle), :func:`proportional_placement` a naive baseline (layers shared in
proportion to memory). ``pipeline-dp`` and ``exhaustive``
(``pipeline_partitioners``) expose them through the partitioner registry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from itertools import combinations
from typing import Union

from experiment_design.errors import TracrError

OBJECTIVES = ("throughput", "latency")
#: the DP visits up to n^2 * 2^(m-1) * m^2 transitions for m devices and n valid cuts: 8
#: devices over 50 cuts take about a second in pure Python.
MAX_DEVICES = 8
#: relative tolerance under which two predicted times count as equal (ties go to the
#: simpler placement: fewer devices, the source alone first).
REL_TOL = 1e-9


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


# ----- the problem, normalized once -------------------------------------------------------
class _Problem:
    """The inputs as arrays: prefix sums of layer times and parameter bytes per device,
    the transfer time of every cut over every usable link."""

    def __init__(self, model: ModelFacts, devices: Mapping[str, DeviceFacts] | Iterable[DeviceFacts],
                 links: Links, source: str) -> None:
        self.model = model
        devs = dict(devices) if isinstance(devices, Mapping) else {d.name: d for d in devices}
        if source not in devs:
            raise TracrError(f"The source '{source}' is not among the devices {sorted(devs)}.")
        for d in devs.values():
            if len(d.layer_ms) != model.n:
                raise TracrError(f"Device {d.name} has {len(d.layer_ms)} layer times but the "
                                 f"model has {model.n} layers.",
                                 hint="Every device must profile the same model.")
        # the source first, the others in the given order
        self.names = [source] + [name for name in devs if name != source]
        self.devices = [devs[name] for name in self.names]
        self.source = source
        self.prefix_ms = [_prefix(d.layer_ms) for d in self.devices]
        # what each device pays per inference for a stage of a chain (not when alone)
        self.hop_ms = [d.overhead_ms for d in self.devices]
        self.byte_ms = [d.byte_ms for d in self.devices]
        self.prefix_bytes = _prefix(model.param_bytes)
        self.memory = [math.inf if d.memory_bytes is None else d.memory_bytes
                       for d in self.devices]
        link_of = links if callable(links) else (lambda a, b: links.get((a, b)))
        self.links = [[None if a == b else link_of(a, b) for b in self.names]
                      for a in self.names]

    def index(self, name: str) -> int:
        """The index of device ``name`` (an error naming the known ones otherwise)."""
        if name not in self.names:
            raise TracrError(f"Unknown device '{name}' in the chain.",
                             hint=f"Known devices: {self.names}.")
        return self.names.index(name)

    def fits(self, d: int, a: int, b: int) -> bool:
        """Whether layers a+1..b fit device d's memory."""
        return self.prefix_bytes[b] - self.prefix_bytes[a] <= self.memory[d]

    def fits_stages(self, stages: Sequence[Stage]) -> bool:
        """Whether every stage fits its device's memory."""
        return all(self.fits(self.index(s.device), s.first - 1, s.last) for s in stages)

    def check(self, stages: Sequence[Stage]) -> None:
        """A TracrError unless ``stages`` are a placement: contiguous over 1..n, the source
        first, each device once, only the source's stage empty, valid cuts between."""
        n, valid = self.model.n, self.model.valid
        problems = []
        if not stages or stages[0].device != self.source:
            problems.append(f"the first stage must run on the source '{self.source}'")
        if len({s.device for s in stages}) != len(stages):
            problems.append("a device appears twice")
        at = 0
        for i, s in enumerate(stages):
            if s.first != at + 1 or s.layers < (0 if i == 0 else 1) or s.last > n:
                problems.append(f"stage {s} does not continue from cut {at}")
            elif i + 1 < len(stages) and not valid[s.last]:
                problems.append(f"cut {s.last} is not a valid boundary")
            at = s.last
        if at != n:
            problems.append(f"the stages end at layer {at}, not {n}")
        if problems:
            raise TracrError(f"Not a placement: {'; '.join(problems)}.")

    def placement(self, stages: Sequence[Stage], objective: str, reason: str = "") -> Placement:
        """The predictions of ``stages`` under the cost model (links must exist)."""
        compute, transfer, memory, overhead, used = [], [], [], [], []
        for i, st in enumerate(stages):
            d = self.index(st.device)
            used.append(self.devices[d])
            a, b = st.first - 1, st.last
            compute.append(self.prefix_ms[d][b] - self.prefix_ms[d][a])
            memory.append(self.prefix_bytes[b] - self.prefix_bytes[a])
            if i + 1 < len(stages):
                to, nbytes = self.index(stages[i + 1].device), self.model.crossing_bytes[b]
            elif d == 0:
                transfer.append(0.0)
                overhead.append(0.0)
                continue
            else:
                to, nbytes = 0, self.model.output_bytes
            received = self.model.crossing_bytes[a] if i > 0 else 0
            overhead.append(self.hop_ms[d] + self.byte_ms[d] * (received + nbytes))
            lk = self.links[d][to]
            if lk is None:
                raise TracrError(f"No link from {st.device} to {self.names[to]}.")
            transfer.append(lk.transfer_ms(nbytes))
        pipelined = objective == "throughput"
        bottleneck = max(stage_time(c, o, t, pipelined)
                         for c, o, t in zip(compute, overhead, transfer, strict=True))
        if pipelined and any(d.uncontended > 1 for d in used):
            # the times are for every limited host busy; a plan that leaves some of them
            # idle part of the time runs its stages faster (a fixed point: the gains
            # shorten the bottleneck, which makes the others busier)
            work = [c + o for c, o in zip(compute, overhead, strict=True)]
            gains = [1.0] * len(stages)
            for _ in range(6):
                gains = contention_gains(used, work, bottleneck)
                bottleneck = max(stage_time(w / g, 0.0, t, True)
                                 for w, g, t in zip(work, gains, transfer, strict=True))
            compute = [c / g for c, g in zip(compute, gains, strict=True)]
            overhead = [o / g for o, g in zip(overhead, gains, strict=True)]
        return Placement(
            stages=tuple(stages),
            objective=objective,
            predicted_throughput_per_s=1000.0 / bottleneck if bottleneck > 0 else math.inf,
            predicted_latency_ms=sum(c + o + t for c, o, t in zip(compute, overhead, transfer,
                                                                   strict=True)),
            compute_ms=tuple(compute),
            transfer_ms=tuple(transfer),
            memory_bytes=tuple(memory),
            reason=reason,
            batch=self.model.batch,
            overhead_ms=tuple(overhead),
        )

    def singles(self, objective: str, max_stages: int) -> list[Placement]:
        """The feasible single-device placements: the source alone, then the source
        forwarding the input to each other device (needs a valid cut 0 and both links)."""
        n, out = self.model.n, []
        if self.fits(0, 0, n):
            out.append(self.placement([Stage(self.source, 1, n)], objective))
        if max_stages < 2 or not self.model.valid[0]:
            return out
        for d in range(1, len(self.names)):
            if self.fits(d, 0, n) and self.links[0][d] and self.links[d][0]:
                out.append(self.placement(
                    [Stage(self.source, 1, 0), Stage(self.names[d], 1, n)], objective))
        return out


def _prefix(values: Sequence[float]) -> list:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


def _search(p: _Problem, mode: str, max_stages: int, bound: float,
            cap: float = math.inf) -> tuple[float, list[Stage]] | None:
    """The DP: the plan that minimizes the largest stage time (``mode="max"``), the sum
    of stage times (``mode="sum"``) or the sum of their squares (``mode="squares"``) with
    every stage <= ``cap``; None if nothing fits.

    A state ``(a, used, d)`` means layers 1..a are placed on the devices in the bit set
    ``used``, every stage so far is costed (its transfer into ``d`` included), and
    device ``d`` (in ``used``) runs the next stage from layer a+1. Since a stage's
    transfer depends on the next device, the transition picks the stage's end b and
    the next device together. Plans worse than ``bound`` (a known feasible value) are
    pruned; ties go to fewer devices. Stage count = devices used, so ``max_stages``
    limits the bit set's size.
    """
    m, n = len(p.names), p.model.n
    if mode == "max":
        comb = max
    elif mode == "squares":
        comb = lambda v, t: v + t * t  # noqa: E731
    else:
        comb = lambda v, t: v + t  # noqa: E731
    pipelined = mode != "sum"  # the throughput objective's stage time (stage_time)
    cross = p.model.crossing_bytes
    ends = [*p.model.interior_cuts(), n]
    # xfer[d][e][b]: stage on d ending at cut b, sending to e
    xfer = [[None if lk is None else [lk.transfer_ms(cross[b]) for b in range(n + 1)]
             for lk in row] for row in p.links]
    back = [0.0] + [None if p.links[d][0] is None else p.links[d][0].transfer_ms(
        p.model.output_bytes) for d in range(1, m)]

    frontier: dict[int, dict[tuple[int, int], float]] = {a: {} for a in [0, *ends]}
    parent: dict[tuple[int, int, int], tuple[tuple[int, int, int], int]] = {}
    # every stage of a chain pays its device's overhead (per stage, per byte it receives
    # or sends); the source alone pays none
    hop, per_byte = p.hop_ms, p.byte_ms
    frontier[0][(1, 0)] = 0.0
    if p.model.valid[0] and max_stages >= 2:  # the source only forwards the input
        for e in range(1, m):
            if xfer[0][e] is None:
                continue
            t = stage_time(0.0, hop[0] + per_byte[0] * cross[0], xfer[0][e][0], pipelined)
            if t <= cap:
                frontier[0][(1 | 1 << e, e)] = comb(0.0, t)
                parent[(0, 1 | 1 << e, e)] = ((0, 1, 0), 0)
    best: tuple[float, int] = (math.inf, m + 1)
    final: tuple[int, int, int] | None = None
    for a in [0, *ends[:-1]]:
        for (used, d), v in frontier[a].items():
            size = used.bit_count()
            pd, room = p.prefix_ms[d], p.memory[d]
            received = cross[a] if d else 0  # what this stage receives (not the source)
            for b in ends:
                if b <= a:
                    continue
                if p.prefix_bytes[b] - p.prefix_bytes[a] > room:
                    break
                c = pd[b] - pd[a]
                if comb(v, c) > bound:
                    break
                if b == n:
                    if back[d] is None:
                        continue
                    o = hop[d] + per_byte[d] * (received + p.model.output_bytes) if size > 1 else 0.0
                    if (t := stage_time(c, o, back[d], pipelined)) > cap:
                        continue
                    key = (comb(v, t), size)
                    if key < best:
                        best, final = key, (a, used, d)
                    continue
                if size >= max_stages:
                    continue
                for e in range(1, m):
                    if used >> e & 1 or xfer[d][e] is None:
                        continue
                    t = stage_time(c, hop[d] + per_byte[d] * (received + cross[b]),
                                   xfer[d][e][b], pipelined)
                    val = comb(v, t)
                    if t > cap or val > bound:
                        continue
                    state = (used | 1 << e, e)
                    if val < frontier[b].get(state, math.inf):
                        frontier[b][state] = val
                        parent[(b, *state)] = ((a, used, d), b)
    if final is None:
        return None
    stages = [Stage(p.names[final[2]], final[0] + 1, n)]
    node = final
    while node in parent:
        prev, b = parent[node]
        stages.append(Stage(p.names[prev[2]], prev[0] + 1, b))
        node = prev
    return best[0], stages[::-1]


def plan_pipeline(model: ModelFacts, devices: Mapping[str, DeviceFacts] | Iterable[DeviceFacts],
                  links: Links, source: str, objective: str = "throughput",
                  max_stages: int | None = None) -> Placement:
    """The best pipeline over (a subset of) ``devices``, the source first.

    ``objective="throughput"`` minimizes the bottleneck stage (then, among plans with that
    bottleneck, the sum of squared stage times: the most room on the other stages);
    ``"latency"`` minimizes the sum of all stages. The DP
    chooses which devices take part, their order and the cuts; ``max_stages`` bounds
    the number of stages (a forwarding source counts as one). The result is a
    single-device placement, with a reason that starts "splitting does not pay", unless
    a plan over several devices is strictly better (:func:`better`). Raises TracrError
    when nothing fits the devices' memory.
    """
    check_objective(objective)
    p = _Problem(model, devices, links, source)
    if len(p.names) > MAX_DEVICES:
        raise TracrError(f"The pipeline planner takes at most {MAX_DEVICES} devices, got "
                         f"{len(p.names)}.", hint="Pass a shorter chain of candidate devices.")
    max_stages = len(p.names) if max_stages is None else int(max_stages)
    if max_stages < 1:
        raise TracrError(f"max_stages must be >= 1, got {max_stages}.")
    singles = p.singles(objective, max_stages)
    single = best_of(singles, objective)
    if objective == "throughput":
        bound = single.bottleneck_ms if single else math.inf
        found = _search(p, "max", max_stages, bound)
        if found is not None:
            # among the plans with that bottleneck, the one whose other stages have the
            # most room (the least sum of squared stage times): a stage that runs slower
            # than its profile then does not become the bottleneck at once. Taking the
            # lowest latency instead gave a paced 3-host lab cuts 32/152 (the last host
            # ran one layer, the middle one a stage 5% under the bottleneck) and 45-51
            # inferences/s, where 32/58 and 32/129 ran 53-60.
            cap = found[0] * (1 + REL_TOL) + 1e-12
            found = _search(p, "squares", max_stages, math.inf, cap)
    else:
        bound = single.predicted_latency_ms if single else math.inf
        found = _search(p, "sum", max_stages, bound)
    plan = p.placement(found[1], objective) if found else None
    if plan is None and single is None:
        raise TracrError(
            f"No placement of the model ({sum(model.param_bytes)} parameter bytes) fits the "
            f"devices' memory over the usable links.",
            hint="Raise memory_bytes, add devices or links, or allow more stages.")
    if single is None or (plan is not None and plan.computing_devices > 1
                          and better(plan, single, objective)):
        return replace(plan, reason=_why_split(plan, single, objective))
    return replace(single, reason=_why_single(single, plan, objective))


def _describe(p: Placement) -> str:
    if len(p.stages) == 1:
        return f"{p.chain[0]} alone"
    if p.stages[0].layers == 0 and len(p.stages) == 2:
        return f"{p.chain[1]} (the input forwarded by {p.chain[0]})"
    return " -> ".join(f"{s.device}[{s.first}..{s.last}]" if s.layers else f"{s.device}[input]"
                       for s in p.stages)


def _metric(p: Placement, objective: str) -> str:
    if objective == "throughput":
        return f"bottleneck {p.bottleneck_ms:.3g} ms ({p.predicted_throughput_per_s:.3g}/s)"
    return f"latency {p.predicted_latency_ms:.3g} ms"


def _why_split(plan: Placement, single: Placement | None, objective: str) -> str:
    vs = (f"; the best single device, {_describe(single)}, has {_metric(single, objective)}"
          if single else "; the model fits no single device")
    slow = plan.stages[plan.stage_ms.index(plan.bottleneck_ms)].device
    return (f"pipeline over {plan.computing_devices} devices, {_describe(plan)}: "
            f"{_metric(plan, objective)}, slowest stage on {slow}{vs}")


def _why_single(single: Placement, plan: Placement | None, objective: str) -> str:
    if plan is None or plan.computing_devices == 1:
        alt = "no plan over several devices does better"
    else:
        alt = (f"the best plan over several devices, {_describe(plan)}, has "
               f"{_metric(plan, objective)}")
    return (f"splitting does not pay: {_describe(single)} has {_metric(single, objective)}; "
            f"{alt}")


# ----- scoring a given placement, the exhaustive sweep, the naive baseline ----------------
def chain_stages(chain: Sequence[str], cuts: Sequence[int], n: int) -> list[Stage]:
    """The stages of ``chain`` separated at ``cuts`` (one fewer than the devices)."""
    if len(cuts) != len(chain) - 1:
        raise TracrError(f"A chain of {len(chain)} devices needs {len(chain) - 1} cuts, got "
                         f"{list(cuts)}.")
    bounds = [0, *cuts, n]
    return [Stage(name, bounds[i] + 1, bounds[i + 1]) for i, name in enumerate(chain)]


def predict(model: ModelFacts, stages: Sequence[Stage],
            devices: Mapping[str, DeviceFacts] | Iterable[DeviceFacts], links: Links,
            source: str, objective: str = "throughput", reason: str = "") -> Placement:
    """The predictions of a given placement under the cost model (say, one a runner was
    told to play); TracrError if ``stages`` are not a placement (see the module's rules).
    Its memory is reported per stage, not checked: see :func:`fits_memory`."""
    check_objective(objective)
    p = _Problem(model, devices, links, source)
    p.check(stages)
    return p.placement(stages, objective, reason)


def fits_memory(model: ModelFacts, stages: Sequence[Stage],
                devices: Mapping[str, DeviceFacts] | Iterable[DeviceFacts]) -> bool:
    """Whether every stage's parameters fit its device's ``memory_bytes``."""
    devs = dict(devices) if isinstance(devices, Mapping) else {d.name: d for d in devices}
    pb = _prefix(model.param_bytes)
    return all(devs[s.device].memory_bytes is None
               or pb[s.last] - pb[s.first - 1] <= devs[s.device].memory_bytes for s in stages)


def count_placements(model: ModelFacts, k: int) -> int:
    """How many cut tuples a chain of ``k`` devices has: C(valid interior cuts, and cut 0
    where valid, k - 1), what :func:`enumerate_placements` returns when memory is
    unlimited."""
    return math.comb(len(_first_cuts(model)), k - 1) if k >= 1 else 0


def _first_cuts(model: ModelFacts) -> list[int]:
    """The cuts a tuple draws from: cut 0 (where valid: the source forwards the input, a
    placement the DP may choose) and every valid interior cut."""
    return [0, *model.interior_cuts()] if model.valid[0] else model.interior_cuts()


def enumerate_placements(model: ModelFacts, chain: Sequence[str], links: Links,
                         devices: Mapping[str, DeviceFacts] | Iterable[DeviceFacts],
                         objective: str = "throughput") -> list[Placement]:
    """Every placement of the fixed ``chain`` (``chain[0]`` is the source) with valid cuts
    0 <= c1 < ... < c_{k-1} < n (c1 = 0 where cut 0 is valid: the source only forwards
    the input, a placement :func:`plan_pipeline` may choose), in lexicographic order of
    the cuts, each with its predictions; tuples whose stages do not fit memory are left
    out. The oracle sweep."""
    check_objective(objective)
    chain = list(chain)
    if not chain or len(set(chain)) != len(chain):
        raise TracrError(f"A chain names each device once, got {chain}.")
    p = _Problem(model, devices, links, chain[0])
    for a, b in [*zip(chain, chain[1:], strict=False), (chain[-1], chain[0])]:
        if a != b and p.links[p.index(a)][p.index(b)] is None:
            raise TracrError(f"No link from {a} to {b} for the chain {chain}.")
    out = []
    for cuts in combinations(_first_cuts(model), len(chain) - 1):
        stages = chain_stages(chain, cuts, model.n)
        if p.fits_stages(stages):
            out.append(p.placement(stages, objective, reason="exhaustive sweep"))
    return out


def proportional_placement(model: ModelFacts,
                           devices: Mapping[str, DeviceFacts] | Iterable[DeviceFacts],
                           chain: Sequence[str], links: Links,
                           objective: str = "throughput") -> Placement:
    """The naive baseline: ``chain[i]`` gets a share of the parameter bytes in proportion
    to its ``memory_bytes`` (an unknown memory counts as the mean of the known ones, all
    unknown as equal shares), cut at the valid cuts nearest those shares. It ignores
    speeds and links and does not check memory; it is what the DP is compared with."""
    chain = list(chain)
    p = _Problem(model, devices, links, chain[0])
    known = [p.devices[p.index(name)].memory_bytes for name in chain]
    fill = sum(m for m in known if m is not None) / max(1, sum(m is not None for m in known))
    weights = [float(m if m is not None else fill or 1.0) for m in known]
    interior = model.interior_cuts()
    k = len(chain)
    if len(interior) < k - 1:
        raise TracrError(f"The model has {len(interior)} valid interior cuts; a chain of {k} "
                         f"devices needs {k - 1}.")
    total, cuts, share = p.prefix_bytes[-1], [], 0.0
    for i in range(k - 1):
        share += weights[i] / sum(weights)
        lo = interior.index(cuts[-1]) + 1 if cuts else 0
        options = interior[lo: len(interior) - (k - 2 - i)]
        cuts.append(min(options, key=lambda c: (abs(p.prefix_bytes[c] - share * total), c)))
    return p.placement(chain_stages(chain, cuts, model.n), objective,
                       reason="layers in proportion to memory")


# ----- the context a pipeline runner hands over -------------------------------------------
@dataclass(frozen=True)
class PipelineContext:
    """Everything the planners need, JSON-able so it can cross a control channel:
    the model's facts, each device's facts by name, the directed links and the source."""

    model: ModelFacts
    devices: dict[str, DeviceFacts]
    links: dict[tuple[str, str], LinkFacts]
    source: str

    def to_dict(self) -> dict:
        """``{"model", "devices": [..], "links": [{"from", "to", "bandwidth_Bps",
        "rtt_ms"}, ..], "source"}``."""
        return {
            "model": self.model.to_dict(),
            "devices": [d.to_dict() for d in self.devices.values()],
            "links": [{"from": a, "to": b, **lk.to_dict()} for (a, b), lk in self.links.items()],
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> PipelineContext:
        """Inverse of :meth:`to_dict`. ``model`` may also be ``{"layers": profile rows,
        "points": split points}``; ``devices`` a list or a ``{name: facts}`` mapping."""
        devs = d.get("devices") or []
        rows = ([{**v, "name": k} for k, v in devs.items()] if isinstance(devs, Mapping)
                else list(devs))
        devices = {r["name"]: DeviceFacts.from_dict(r) for r in rows}
        links = {}
        for r in d.get("links") or []:
            if r["from"] not in devices or r["to"] not in devices:
                raise TracrError(f"A link names an unknown device: {r['from']} -> {r['to']}.",
                                 hint=f"Known devices: {sorted(devices)}.")
            links[(r["from"], r["to"])] = LinkFacts(float(r["bandwidth_Bps"]),
                                                    float(r.get("rtt_ms") or 0.0))
        if d.get("source") not in devices:
            raise TracrError(f"The pipeline context's source {d.get('source')!r} is not one "
                             f"of its devices {sorted(devices)}.")
        return cls(ModelFacts.from_dict(d["model"]), devices, links, str(d["source"]))
