"""``pipeline-dp`` and ``exhaustive``: the pipeline planners behind the partitioner registry.

A pipeline runner (k >= 2 devices) calls :meth:`PipelineDP.plan` /
:meth:`Exhaustive.plan` with a :class:`~experiment_design.partitioners.pipeline.PipelineContext`
(or its JSON form) and gets placements back. Today's edge/cloud runner keeps
calling ``setup(PartitionContext)`` and ``next_split()``: both partitioners
read that context as a two-device pipeline (``edge`` is the source, ``cloud`` the
other device, the probed link both ways), so they work there unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.partitioners import regression
from experiment_design.partitioners.base import (
    PartitionContext,
    Partitioner,
    register_partitioner,
)
from experiment_design.partitioners.cyclic import CyclicPartitioner
from experiment_design.partitioners.pipeline import (
    DeviceFacts,
    LinkFacts,
    ModelFacts,
    PipelineContext,
    Placement,
    Stage,
    best_of,
    check_objective,
    enumerate_placements,
    fits_memory,
    full_mesh,
    plan_pipeline,
    predict,
)
from experiment_design.partitioners.predicted import calibration, layer_ms_of, link


def device_from_profile(name: str, profile: Mapping | None, layers: Sequence[Mapping],
                        memory_bytes: int | None = None, calibrate: bool = True,
                        sustained: bool = False, overhead_cpu_ms: float | None = None,
                        ns_per_byte: float | None = None,
                        busy_factor: float | None = None) -> DeviceFacts:
    """A device's facts from a participant's start-up profile.

    The layer times are scaled so they sum to the measured full pass when the profile
    has one (``predicted.calibration``); a layer the profile did not time gets the
    per-class regression of the timed ones, as in ``predicted-argmin``. The memory is
    ``memory_bytes``, else the profile's own ``memory_bytes``, else unlimited.

    ``sustained``: the times a stage takes when it is busy all the time (a pipeline in
    throughput mode). A host under a CFS quota of q cores runs a pass at full speed while
    its quota lasts, so start-up passes with gaps between them see the burst speed; busy
    all the time it gets q cores, and a layer's time becomes its CPU time / q. Measured
    in the lab at 0.6 core: mobilenet_v2 layers 1..120 took 6.9 ms alone and 12.4 ms in
    a busy pipeline (8.1 ms of CPU).

    ``overhead_cpu_ms``: the CPU time a stage on this device spends per inference beside
    its layers and the bytes it moves, and ``ns_per_byte``: the CPU per byte it receives
    or sends (both fitted on the chain by ``EdgeRole.probe_overhead``; the per-byte cost
    from the link probes where the fit fails): both become wall time at
    the rate the layers do (their total over ``full_cpu_ms``, at least 1: the
    work is one thread's), so under a quota of q cores they weigh 1/q. Measured in the
    lab, a 0.1-core host given layers 34..42 of mobilenet_v2 ran them in 17.7 ms where
    the layers alone were predicted at 7.0 ms; its overhead, probed, was 1.9 ms of CPU
    per inference: 19 ms at 0.1 core.

    ``busy_factor`` (with ``sustained``): how much more CPU this device's layers take
    with inferences in flight than in its profile (``EdgeRole.probe_busy``). A quota'd
    host busy all the time is stopped every period and its caches go cold: in the lab at
    0.6 core, mobilenet_v2's stages took 1.36-1.55x their profiled CPU in throughput
    mode and 1.07-1.25x one inference at a time.
    """
    ms = layer_ms_of(profile, len(layers)) if profile else None
    shape = _stall_free(profile, len(layers)) if sustained else None
    if shape is not None and ms is not None and len(ms) == len(layers):
        # under a quota the medians keep the stalls that back-to-back passes put on the same
        # layers (at 0.1 core a pass is ~20 periods): each layer's fastest run is its share
        # of the CPU work, and calibration below restores the measured total
        ms = [m if v is None else v for v, m in zip(shape, ms, strict=True)]
    if ms is None or len(ms) != len(layers):
        raise TracrError(f"No per-layer profile of {len(layers)} layers for device {name}.",
                         hint="The runner profiles each participant at start-up; check its log.")
    ms = [None if v is None or not math.isfinite(float(v)) else float(v) for v in ms]
    if all(v is None for v in ms):
        raise TracrError(f"The profile of device {name} times no layer.")
    if calibrate:
        f = calibration(profile, ms)
        ms = [None if v is None else v * f for v in ms]
    if any(v is None for v in ms):
        models = regression.fit_feature_models(layers, ms)
        ms = [v if v is not None else regression.predict_features(models, row)
              for v, row in zip(ms, layers, strict=True)]
    shared: dict = {}
    if sustained:
        f = sustained_factor(profile)
        ms = [v * f * float(busy_factor or 1.0) for v in ms]
        shared = sharing(profile) if f > 1 else {}
    mem = memory_bytes if memory_bytes is not None else profile.get("memory_bytes")
    cpu = (profile or {}).get("full_cpu_ms")
    rate = max(1.0, sum(ms) / float(cpu)) if cpu else 1.0  # wall ms per CPU ms
    return DeviceFacts(name, tuple(ms), mem, float(overhead_cpu_ms or 0.0) * rate,
                       float(ns_per_byte or 0.0) / 1e6 * rate, **shared)


def sharing(profile: Mapping | None) -> dict:
    """How a lab host shares the machine's CPUs with the other limited hosts, for
    :func:`~experiment_design.partitioners.pipeline.contention_gains`: ``cores`` (what a
    busy loop got alone under its quota), ``uncontended`` (that over what it got with
    every limited host busy: the times :func:`sustained_factor` plans with) and
    ``machine_cpus``; empty where the lab did not measure both shares, and for paced
    hosts (``--cpu-mode duty``): the pacer gives a host that idles between bursts no
    more than a busy one, so a paced stage runs at the all-busy share however idle the
    others are (MobileNetV2's stages, busy 48-90% of the time, took 1.72-1.87x their CPU
    time in wall time, 1.86 all busy, 1.68 alone), where under a CFS quota AlexNet's
    head ran at 0.597 of a core with the others busy a third and a half of the time,
    0.56 all busy."""
    quota = (profile or {}).get("cpu_quota") or {}
    alone, together = quota.get("measured"), quota.get("measured_together")
    if not (alone and together) or quota.get("mode", "quota") != "quota":
        return {}
    return {"cores": float(alone), "uncontended": max(1.0, float(alone) / float(together)),
            "machine_cpus": quota.get("machine_cpus")}


def _stall_free(profile: Mapping | None, n: int) -> list | None:
    """The shape of the work on a host under a CPU quota (or the lab's pacer): each
    layer's CPU time (``layers_cpu``) where the profile has it, else its fastest profiled
    run (``layers_min``); None without a quota (or in an older profile without either).

    Each layer's fastest run keeps the stops of a paced host in every layer longer than
    the pacer's slice: in the lab at 0.6 core (2 ms cycle) it gave mobilenet_v2's layers
    1..32 54% of the model's time, where they took 39% of it in the pipeline."""
    if not (profile or {}).get("cpu_quota"):
        return None
    for key in ("layers_cpu", "layers_min"):
        times = profile.get(key)
        if isinstance(times, Mapping):
            return [times.get(str(i), times.get(i)) for i in range(1, n + 1)]
    return None


def sustained_factor(profile: Mapping | None) -> float:
    """How much slower than its start-up passes a host runs when busy all the time:
    CPU per wall second of a full pass over the quota's cores (1 without a quota).

    The cores are what a busy loop measured under the quota where the lab measured it: a
    CFS period shorter than the kernel's tick (4 ms at HZ=250) delivers less than the
    quota (0.47 of a core for 0.6 at a 1.667 ms period, measured). Where the lab also
    measured every limited host busy at once (``measured_together``), that share is the
    one a busy stage gets: three paced hosts of 0.6 core on two CPUs got 0.46-0.60 each
    at a 1 ms tick, 0.51-0.55 at 2 ms."""
    quota = (profile or {}).get("cpu_quota") or {}
    cores = (quota.get("measured_together") or quota.get("measured") or quota.get("fraction")
             or quota.get("cores"))
    if not cores:
        return 1.0
    wall, cpu = (profile or {}).get("full_ms"), (profile or {}).get("full_cpu_ms")
    busy = float(cpu) / float(wall) if wall and cpu else 1.0
    return max(1.0, busy / float(cores))


def from_partition_context(ctx: PartitionContext,
                           params: Mapping[str, Any] | None = None) -> PipelineContext:
    """The k = 2 view of today's edge/cloud run: devices ``edge`` (the source) and
    ``cloud`` from the two profiles, the probed link both ways (``bandwidth_Bps`` /
    ``rtt_ms`` in ``params`` override it, as for ``predicted-argmin``), and the cuts
    outside ``ctx.valid_splits`` marked invalid."""
    params = params or {}
    model = ModelFacts.from_rows(ctx.layers, ctx.points)
    allowed = set(ctx.valid_splits)
    model = replace(model, valid=tuple(v and k in allowed for k, v in enumerate(model.valid)))
    devices = {side: device_from_profile(side, getattr(ctx, f"{side}_profile"), ctx.layers,
                                         calibrate=bool(params.get("calibrate", True)))
               for side in ("edge", "cloud")}
    bw, rtt, _ = link(ctx, params)
    return PipelineContext(model, devices, full_mesh(devices, LinkFacts(bw, rtt)), "edge")


def as_pipeline_context(ctx_like: PipelineContext | PartitionContext | Mapping,
                        params: Mapping[str, Any] | None = None) -> PipelineContext:
    """A :class:`PipelineContext` from itself, its JSON form, or (k = 2) a
    ``PartitionContext``; ``params["batch"]``, when set, is the model's batch."""
    if isinstance(ctx_like, PipelineContext):
        pctx = ctx_like
    elif isinstance(ctx_like, PartitionContext):
        pctx = from_partition_context(ctx_like, params)
    else:
        pctx = PipelineContext.from_dict(ctx_like)
    batch = (params or {}).get("batch")
    if batch is not None:
        pctx = replace(pctx, model=replace(pctx.model, batch=int(batch)))
    return pctx


def two_device_table(pctx: PipelineContext, objective: str) -> dict[int, Placement]:
    """k = 2: the placement at each valid split k of source -> the other device (k = 0:
    forward the input; k = n: the source alone); splits that do not fit are left out."""
    other = [d for d in pctx.devices if d != pctx.source]
    if len(other) != 1:
        raise TracrError(f"A two-device table needs exactly two devices, got {list(pctx.devices)}.")
    n, out = pctx.model.n, {}
    for k in range(n + 1):
        if not pctx.model.valid[k]:
            continue
        stages = ([Stage(pctx.source, 1, n)] if k == n
                  else [Stage(pctx.source, 1, k), Stage(other[0], k + 1, n)])
        if fits_memory(pctx.model, stages, pctx.devices):
            out[k] = predict(pctx.model, stages, pctx.devices, pctx.links, pctx.source, objective)
    return out


@register_partitioner("pipeline-dp")
class PipelineDP(Partitioner):
    """The DP placement (:func:`~experiment_design.partitioners.pipeline.plan_pipeline`).

    Params: ``objective`` (``throughput``, default, or ``latency``); ``max_stages``;
    ``chain``: the device instance names that may take part (the DP picks which and in
    what order; default all; the source must be among them); ``batch``: samples per
    pass (it scales the reported samples/s only). From a ``PartitionContext`` also
    ``bandwidth_Bps`` / ``rtt_ms`` (a what-if link) and ``calibrate`` (default true),
    as for ``predicted-argmin``.

    A pipeline runner calls :meth:`plan` and gets one placement. Today's edge/cloud
    runner calls :meth:`setup`; ``next_split()`` is then the best of the k = 2
    placements at the context's valid splits (0 = send the input, n = the edge alone),
    ties going to not splitting: what :meth:`plan` picks for those two devices. Note
    that runner measures one inference at a time, so ``objective: latency`` is the one
    its sweep can score.
    """

    #: profiles: every chain member's (a pipeline run); the pair's for today's runner
    needs = frozenset({"edge_profile", "cloud_profile", "network", "profiles"})

    def __init__(self, objective: str = "throughput", max_stages: int | None = None,
                 chain: Sequence[str] | None = None, batch: int | None = None,
                 **params: Any) -> None:
        super().__init__(objective=objective, max_stages=max_stages, chain=chain, batch=batch,
                         **params)
        self.objective = check_objective(objective)
        self.max_stages = max_stages
        self.chain = list(chain) if chain is not None else None
        self.k: int | None = None
        self._decision: dict = {}

    def plan(self, ctx_like: PipelineContext | PartitionContext | Mapping) -> list[Placement]:
        """``[the DP's placement]`` for the context (also kept for :meth:`decision`)."""
        pctx = as_pipeline_context(ctx_like, self.params)
        names = list(pctx.devices) if self.chain is None else self.chain
        unknown = [c for c in names if c not in pctx.devices]
        if unknown:
            raise TracrError(f"pipeline-dp: unknown device(s) {unknown} in the chain.",
                             hint=f"Known devices: {sorted(pctx.devices)}.")
        placement = plan_pipeline(pctx.model, [pctx.devices[c] for c in names], pctx.links,
                                  pctx.source, self.objective, self.max_stages)
        self._decision = {"name": self.name, "params": self.params,
                          "placement": placement.to_dict(), "reason": placement.reason,
                          # what a stage on each device pays beside its layers: per
                          # inference, and per byte it receives or sends
                          "overhead_ms": {c: pctx.devices[c].overhead_ms for c in names},
                          "byte_ms": {c: pctx.devices[c].byte_ms for c in names},
                          # how much faster than planned (all hosts busy) a device runs
                          # when the others idle (plain-quota lab hosts; 1: no gain)
                          "uncontended": {c: pctx.devices[c].uncontended for c in names}}
        return [placement]

    def setup(self, ctx: PartitionContext) -> None:
        """k = 2: predict every valid split of edge -> cloud and keep the best."""
        super().setup(ctx)
        pctx = as_pipeline_context(ctx, self.params)
        table = two_device_table(pctx, self.objective)
        n = pctx.model.n
        # the single-device splits first, so a tie goes to not splitting (as in plan_pipeline)
        order = sorted(table, key=lambda k: (0 < k < n, k != n, k))
        best = best_of((table[k] for k in order), self.objective)
        if best is None:
            raise TracrError("pipeline-dp: no split fits the devices' memory.")
        self.k = next(k for k in order if table[k] is best)
        self._decision = {
            "name": self.name,
            "chosen": self.k,
            "criterion": f"best predicted {self.objective}, edge -> cloud",
            "params": self.params,
            "predicted": {k: p.predicted_latency_ms for k, p in table.items()},
            "predicted_bottleneck_ms": {k: p.bottleneck_ms for k, p in table.items()},
            "chosen_ms": best.predicted_latency_ms,
            "placement": best.to_dict(),
        }

    def next_split(self) -> int:
        """The chosen split, every time."""
        if self.k is None:
            raise TracrError("pipeline-dp: next_split() called before setup().")
        return self.k

    def decision(self) -> dict:
        """The chosen placement and its predictions (per split for k = 2)."""
        return self._decision or {"name": self.name, "params": self.params, "chosen": None}


@register_partitioner("exhaustive")
class Exhaustive(CyclicPartitioner):
    """The oracle sweep: every cut tuple of one fixed chain (``enumerate_placements``).

    Params: ``chain``: device instance names in stage order, the source first (default:
    the source, then the context's other devices in order); ``stages``: only the first
    ``stages`` devices of that chain; ``cuts``: only these cut tuples (e.g. ``[[5, 12],
    [5, 13]]``, to measure a sweep's contenders again), in the order given; ``objective``:
    the label the placements carry; ``batch`` as for ``pipeline-dp``; and every ``cyclic``
    param, for today's edge/cloud runner, where it walks every valid split exactly as
    ``cyclic`` does.
    """

    #: a pipeline run profiles every chain member, for the placements' predictions
    needs = frozenset({"profiles"})

    def __init__(self, chain: Sequence[str] | None = None, stages: int | None = None,
                 objective: str = "throughput", batch: int | None = None,
                 cuts: Sequence[Sequence[int]] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.params.update(chain=chain, stages=stages, objective=objective, batch=batch)
        if cuts is not None:
            try:
                self.cuts = [tuple(int(k) for k in c) for c in cuts]
            except (TypeError, ValueError):
                raise TracrError(f"exhaustive: cuts must be a list of cut lists, got {cuts!r}",
                                 hint="e.g. partitioner.params.cuts=[[5,12],[5,13]]") from None
            self.params["cuts"] = [list(c) for c in self.cuts]
        else:
            self.cuts = None
        self.objective = check_objective(objective)
        self.chain = list(chain) if chain is not None else None
        if stages is not None and int(stages) < 1:
            raise TracrError(f"exhaustive: stages must be >= 1, got {stages}.")
        self.stages = None if stages is None else int(stages)

    def chain_of(self, pctx: PipelineContext) -> list[str]:
        """The chain this sweep walks in ``pctx``."""
        names = self.chain or [pctx.source, *(d for d in pctx.devices if d != pctx.source)]
        names = names[: self.stages] if self.stages else names
        if names[0] != pctx.source:
            raise TracrError(f"exhaustive: the chain {names} must start at the source "
                             f"'{pctx.source}'.")
        return names

    def plan(self, ctx_like: PipelineContext | PartitionContext | Mapping) -> list[Placement]:
        """Every placement of the chain, in lexicographic order of the cuts."""
        pctx = as_pipeline_context(ctx_like, self.params)
        every = enumerate_placements(pctx.model, self.chain_of(pctx), pctx.links, pctx.devices,
                                     self.objective)
        if self.cuts is None:
            return every
        by_cuts = {p.cuts: p for p in every}
        missing = [list(c) for c in self.cuts if c not in by_cuts]
        if missing:
            raise TracrError(f"exhaustive: cuts {missing} are not placements of the chain "
                             f"{self.chain_of(pctx)}",
                             hint="each needs one cut per boundary, increasing, at valid splits")
        return [by_cuts[c] for c in dict.fromkeys(self.cuts)]
