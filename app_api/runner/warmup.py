"""Warm-up phase: unrecorded passes, then the partitioner's start-up measurements."""

from __future__ import annotations

import dataclasses

from app_api.results.scored import fidelity_request, split_choices
from app_api.results.store import ResultsWriteError
from app_api.runner.state import RunState
from experiment_design.protocol import LinkProbe, Measurements, ProfileParams, partition_context
from experiment_design.roles.profiling import cold_gap_for

# start-up profile: per-layer medians of timed passes + the median of untimed full passes
# (the calibration partitioners scale the layer times to; see partitioners/predicted.py)
PROFILE_PARAMS = ProfileParams(repeats=7, full_repeats=9)
PROFILES_FILE = "profiles.json"


def warmup(state: RunState) -> None:
    """Warm every participant up, then measure what each partitioner needs and set it up."""
    m = state.manifest
    n = int((m.run or {}).get("warmup", 2) or 0)
    state.view.phase(f"warm-up ({n} round trips per end split, not recorded)")
    for inst in state.handles:
        state.client(inst).warmup(n)
    evaluate = list(((m.evaluate or {}).get("partitioners")) or [])
    for inst, info in state.infos.items():
        if info.partitioner_needs is None:
            continue
        needs = set(info.partitioner_needs)
        if evaluate and state.eval_ctx is None:
            # scoring other partitioners afterwards needs the same start-up measurements
            needs |= {"edge_profile", "cloud_profile", "network"}
        ctx = measure(state, inst, needs)
        if evaluate and state.eval_ctx is None and "fidelity" not in needs:
            # a scored partitioner that needs the head's fidelity probe (split-codec)
            ctx.fidelity = fidelity_request(evaluate, (m.partitioner or {}).get("params"))
        if evaluate and state.eval_ctx is None:
            # what the scored partitioners will choose, raced beside the sweep's contenders
            ctx.scored_choices = split_choices(evaluate, partition_context(info, ctx),
                                               (m.partitioner or {}).get("params")) or None
        plan = state.client(inst).prepare_partitioner(ctx)
        state.partitioners[inst] = None if plan is None else plan.to_dict()
        if evaluate and state.eval_ctx is None:
            state.eval_ctx = {**partition_context(info, ctx),
                              "fidelity": None if plan is None else plan.fidelity}
    state.extra["partitioner"] = state.partitioners


def measure(state: RunState, inst: str, needs: set[str]) -> Measurements:
    """The start-up measurements ``inst``'s partitioner asked for (``needs``)."""
    ctx = Measurements()
    partners = [b for a, b in state.pairs if a == inst]
    if "edge_profile" in needs:
        ctx.edge_profile = profile_of(state, inst)
    if "cloud_profile" in needs and partners:
        ctx.cloud_profile = profile_of(state, partners[0])
    if partners:
        # always measured (cheap, raw payloads): the link figure belongs in every summary
        net = state.client(inst).probe_link(LinkProbe())
        state.extra.setdefault("network", {})[inst] = {
            k: v for k, v in (net or {}).items() if k != "samples"}
        if "network" in needs:
            ctx.network = net
    # the profiles measured so far, by participant
    known = {inst: ctx.edge_profile, **({partners[0]: ctx.cloud_profile} if partners else {})}
    chain = list((state.manifest.pipeline or {}).get("chain") or [])
    if chain and inst == chain[0]:
        # a chain: every member's links (for the stage times of each configuration's
        # bound), and each member's profile when the partitioner plans placements
        ctx.links = {}
        for member in chain:
            ctx.links.update(state.client(member).probe_links())
        state.extra["links"] = ctx.links
        if "profiles" in needs:
            ctx.profiles = {member: known.get(member) or profile_of(state, member)
                            for member in chain}
    keep_profiles(state, {**known, **(ctx.profiles or {})})
    if "measured" in needs:
        ctx.measured = (state.manifest.partitioner.get("params") or {}).get("measured")
    return ctx


def profile_of(state: RunState, member: str) -> dict | None:
    """``member``'s start-up profile, told the lab's CPU quota of its host where it has
    one: a lab host cannot see its own (its cgroup is not mounted in its namespace), and
    without it the profile has no per-layer CPU times (``layers_cpu``) and its cold
    passes' gaps do not fit the quota's period. Only the head was told before: a chain's
    other members planned from each layer's fastest run, which under a quota keeps the
    stall of a layer longer than the budget (AlexNet's layers 14..17 took 43% of a
    0.6-core host's pass by their fastest runs, 36% by their CPU time)."""
    lab_quota = state.facts.cpu_quota(state.handles[member].device)
    params = PROFILE_PARAMS
    if lab_quota:
        params = dataclasses.replace(params, cold_gap_ms=cold_gap_for(lab_quota["period_ms"]),
                                     cpu_quota=lab_quota)
    return with_quota(state.client(member).profile_layers(params), lab_quota)


def keep_profiles(state: RunState, profiles: dict) -> None:
    """Add the start-up profiles a partitioner decided from to the run's ``profiles.json``
    (participant -> profile), so its decision can be checked and replayed afterwards."""
    profiles = {k: v for k, v in profiles.items() if v}
    if not profiles or state.writer is None:
        return
    state.profiles.update(profiles)
    try:
        state.writer.write_json(PROFILES_FILE, state.profiles)
    except ResultsWriteError as exc:  # the run's own measurements matter more
        state.errors.append(str(exc))


def with_quota(profile: dict | None, quota: dict | None) -> dict | None:
    """Add ``quota`` (the lab's) to a profile that could not read its own."""
    if isinstance(profile, dict) and quota and not profile.get("cpu_quota"):
        profile["cpu_quota"] = quota
    return profile
