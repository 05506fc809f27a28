"""The planner: a dynamic program over (layers done, devices used, next device)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from experiment_design.errors import TracrError
from experiment_design.partitioners.pipeline.facts import DeviceFacts, Links, ModelFacts
from experiment_design.partitioners.pipeline.placement import (
    REL_TOL,
    Placement,
    Stage,
    best_of,
    better,
    check_objective,
    contention_gains,
    stage_time,
)

#: the DP visits up to n^2 * 2^(m-1) * m^2 transitions for m devices and n valid cuts: 8
#: devices over 50 cuts take about a second in pure Python.
MAX_DEVICES = 8

# ----- the problem, normalized once -------------------------------------------------------
class Problem:
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
        self.prefix_ms = [prefix_sums(d.layer_ms) for d in self.devices]
        # what each device pays per inference for a stage of a chain (not when alone)
        self.hop_ms = [d.overhead_ms for d in self.devices]
        self.byte_ms = [d.byte_ms for d in self.devices]
        self.prefix_bytes = prefix_sums(model.param_bytes)
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


def prefix_sums(values: Sequence[float]) -> list:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


def _search(p: Problem, mode: str, max_stages: int, bound: float,
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
    p = Problem(model, devices, links, source)
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

