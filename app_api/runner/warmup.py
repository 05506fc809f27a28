"""Warm-up phase: unrecorded passes, then the partitioner's start-up measurements."""

from __future__ import annotations

import dataclasses

from app_api.runner.evaluate import fidelity_request
from app_api.runner.state import RunState
from experiment_design.protocol import LinkProbe, Measurements, ProfileParams, partition_context
from experiment_design.roles.profiling import cold_gap_for

# start-up profile: per-layer medians of timed passes + the median of untimed full passes
# (the calibration partitioners scale the layer times to; see partitioners/predicted.py)
PROFILE_PARAMS = ProfileParams(repeats=7, full_repeats=9)


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
        lab_quota = state.facts.cpu_quota(state.handles[inst].device)
        params = PROFILE_PARAMS
        if lab_quota:  # the edge cannot see the lab's period: size its cold-pass gaps here
            params = dataclasses.replace(params, cold_gap_ms=cold_gap_for(lab_quota["period_ms"]),
                                         cpu_quota=lab_quota)
        ctx.edge_profile = with_quota(state.client(inst).profile_layers(params), lab_quota)
    if "cloud_profile" in needs and partners:
        ctx.cloud_profile = state.client(partners[0]).profile_layers(PROFILE_PARAMS)
    if partners:
        # always measured (cheap, raw payloads): the link figure belongs in every summary
        net = state.client(inst).probe_link(LinkProbe())
        state.extra.setdefault("network", {})[inst] = {
            k: v for k, v in (net or {}).items() if k != "samples"}
        if "network" in needs:
            ctx.network = net
    chain = list((state.manifest.pipeline or {}).get("chain") or [])
    if chain and inst == chain[0]:
        # a chain: every member's links (for the stage times of each configuration's
        # bound), and each member's profile when the partitioner plans placements
        ctx.links = {}
        for member in chain:
            ctx.links.update(state.client(member).call("probe_links") or {})
        state.extra["links"] = ctx.links
        if "profiles" in needs:
            known = {inst: ctx.edge_profile, **({partners[0]: ctx.cloud_profile}
                                                if partners else {})}
            ctx.profiles = {member: with_quota(
                known.get(member) or state.client(member).profile_layers(PROFILE_PARAMS),
                state.facts.cpu_quota(state.handles[member].device)) for member in chain}
    if "measured" in needs:
        ctx.measured = (state.manifest.partitioner.get("params") or {}).get("measured")
    return ctx


def with_quota(profile: dict | None, quota: dict | None) -> dict | None:
    """Add ``quota`` (the lab's) to a profile that could not read its own."""
    if isinstance(profile, dict) and quota and not profile.get("cpu_quota"):
        profile["cpu_quota"] = quota
    return profile
