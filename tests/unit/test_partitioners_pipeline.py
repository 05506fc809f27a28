"""Pipeline placement: the DP against brute force, single-device fallback, memory, valid
cuts, the exhaustive sweep, the naive baseline, and the registered partitioners."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from itertools import combinations, permutations

import pytest

from experiment_design.errors import TracrError
from experiment_design.partitioners import (
    PartitionContext,
    create_partitioner,
    list_partitioners,
)
from experiment_design.partitioners.pipeline import (
    DeviceFacts,
    LinkFacts,
    ModelFacts,
    PipelineContext,
    Placement,
    Stage,
    chain_stages,
    count_placements,
    enumerate_placements,
    fits_memory,
    full_mesh,
    plan_pipeline,
    predict,
    proportional_placement,
)
from experiment_design.partitioners.pipeline_partitioners import from_partition_context

MB = 1_000_000


# ----- an independent brute force -------------------------------------------------------
def _cost(model, devices, links, source, chain, bounds, pipelined=True):
    """(bottleneck, latency) of ``chain`` over ``bounds`` [(a, b), ...], or None when a
    stage does not fit or a link is missing; written apart from the module on purpose.
    The bottleneck is of the stage times with passes in flight (``pipelined``: the
    throughput objective's) or one pass at a time; the latency is the sum of all."""
    parts = _stage_parts(model, devices, links, source, chain, bounds)
    if parts is None:
        return None
    each = [max(c, t) if pipelined else c + t for c, t in parts]
    return max(each), sum(c + t for c, t in parts)


def _stage_parts(model, devices, links, source, chain, bounds):
    """Each stage's (CPU work, outgoing transfer): compute, plus when the chain has two
    or more stages its device's overhead (per stage, and per byte it receives and
    sends); the transfer of what it sends on. None: see _cost."""
    times = []
    for i, (dev, (a, b)) in enumerate(zip(chain, bounds, strict=True)):
        mem = devices[dev].memory_bytes
        if mem is not None and sum(model.param_bytes[a:b]) > mem:
            return None
        c = sum(devices[dev].layer_ms[a:b])
        if i + 1 < len(chain):
            to, nbytes = chain[i + 1], model.crossing_bytes[b]
        elif dev == source:
            times.append((c, 0.0))
            continue
        else:
            to, nbytes = source, model.output_bytes
        lk = links.get((dev, to))
        if lk is None:
            return None
        moved = nbytes + (model.crossing_bytes[a] if i > 0 else 0)
        c += devices[dev].overhead_ms + devices[dev].byte_ms * moved
        times.append((c, nbytes / lk.bandwidth_Bps * 1000 + lk.rtt_ms / 2))
    return times


def brute_force(model, devices, links, source, max_stages=None):
    """Every feasible placement: [(chain, bounds, bottleneck, latency, sum of squared
    stage times)]."""
    n = model.n
    max_stages = max_stages or len(devices)
    others = [d for d in devices if d != source]
    interior = [k for k in range(1, n) if model.valid[k]]
    out = []
    for r in range(len(others) + 1):
        for perm in permutations(others, r):
            chain = [source, *perm]
            if len(chain) > max_stages:
                continue
            tuples = [list(zip([0, *c], [*c, n], strict=True)) for c in combinations(interior, r)]
            if r >= 1 and model.valid[0]:  # the source only forwards the input
                tuples += [[(0, 0), *zip([0, *c], [*c, n], strict=True)]
                           for c in combinations(interior, r - 1)]
            for bounds in tuples:
                parts = _stage_parts(model, devices, links, source, chain, bounds)
                if parts is not None:
                    times = [max(c, t) for c, t in parts]
                    out.append((chain, bounds, max(times), sum(c + t for c, t in parts),
                                sum(t * t for t in times)))
    return out


def singles_of(model, devices, links, source, pipelined=True):
    """(bottleneck, latency) of the single-device placements that fit."""
    n, out = model.n, []
    alone = _cost(model, devices, links, source, [source], [(0, n)], pipelined)
    if alone:
        out.append(alone)
    if model.valid[0]:
        for d in devices:
            if d != source and (got := _cost(model, devices, links, source, [source, d],
                                             [(0, 0), (0, n)], pipelined)):
                out.append(got)
    return out


def random_instance(rng: random.Random):
    """A small instance with quantized numbers, so that exact ties happen."""
    n, m = rng.randint(2, 7), rng.randint(2, 4)
    names = [f"d{i}" for i in range(m)]
    params = [rng.choice([0, 0, 10, 40, 100]) for _ in range(n)]
    model = ModelFacts(
        n=n,
        crossing_bytes=[rng.choice([0, 1000, 4000, 20000]) for _ in range(n + 1)],
        valid=[rng.random() < 0.75 for _ in range(n + 1)],
        param_bytes=params,
        output_bytes=rng.choice([0, 1000, 4000]),
    )
    devices = {}
    for name in names:
        mem = None if rng.random() < 0.4 else rng.choice([40, 100, 150, 250])
        devices[name] = DeviceFacts(name, [rng.choice([0, 0.5, 1, 2, 3, 8]) for _ in range(n)],
                                    mem, rng.choice([0.0, 0.0, 0.5, 2.0]),
                                    rng.choice([0.0, 0.0, 1e-4, 1e-3]))
    links = {}
    for a, b in permutations(names, 2):
        if rng.random() < 0.85:
            links[(a, b)] = LinkFacts(rng.choice([1e5, 1e6, 1e7]), rng.choice([0.0, 1.0]))
    max_stages = rng.choice([None, None, 1, 2, 3])
    return model, devices, links, rng.choice(names), max_stages


# ----- the DP equals brute force ----------------------------------------------------------
@pytest.mark.parametrize("objective", ["throughput", "latency"])
def test_dp_equals_brute_force_on_random_instances(objective):
    rng = random.Random(12 if objective == "throughput" else 34)
    checked = infeasible = split = 0
    for _ in range(200):
        model, devices, links, source, max_stages = random_instance(rng)
        plans = brute_force(model, devices, links, source, max_stages)
        if not plans:
            with pytest.raises(TracrError, match="fits"):
                plan_pipeline(model, devices, links, source, objective, max_stages)
            infeasible += 1
            continue
        got = plan_pipeline(model, devices, links, source, objective, max_stages)
        split += got.computing_devices > 1
        assert len(got.stages) <= (max_stages or len(devices))
        assert fits_memory(model, got.stages, devices)
        assert all(model.valid[c] for c in got.cuts), (got.cuts, model.valid)
        assert all(s.layers >= 1 for s in got.stages[1:])
        if objective == "throughput":
            best = min(p[2] for p in plans)
            assert got.bottleneck_ms == pytest.approx(best, rel=1e-9, abs=1e-12)
            # and among the plans with that bottleneck, the most room on the other stages:
            # the least sum of squared stage times
            at_best = min(p[4] for p in plans if p[2] <= best * (1 + 1e-9) + 1e-12)
            got_sq = sum(t * t for t in got.stage_ms)
            assert got_sq == pytest.approx(at_best, rel=1e-9, abs=1e-12)
        else:
            best = min(p[3] for p in plans)
            assert got.predicted_latency_ms == pytest.approx(best, rel=1e-9, abs=1e-12)
        # the placement's own numbers agree with the independent cost
        bounds = [(s.first - 1, s.last) for s in got.stages]
        assert _cost(model, devices, links, source, list(got.chain), bounds,
                     objective == "throughput") == pytest.approx(
            (got.bottleneck_ms, got.predicted_latency_ms))
        checked += 1
    assert checked > 150 and infeasible > 0 and split > 20, (checked, infeasible, split)


@pytest.mark.parametrize("objective", ["throughput", "latency"])
def test_never_worse_than_the_best_single_device(objective):
    rng = random.Random(56)
    compared = 0
    for _ in range(200):
        model, devices, links, source, _ = random_instance(rng)
        singles = singles_of(model, devices, links, source, objective == "throughput")
        if not singles:
            continue
        got = plan_pipeline(model, devices, links, source, objective)
        i = 0 if objective == "throughput" else 1
        mine = (got.bottleneck_ms, got.predicted_latency_ms)[i]
        assert mine <= min(s[i] for s in singles) * (1 + 1e-9)
        if got.computing_devices == 1:
            assert got.reason.startswith("splitting does not pay")
        else:  # a split is returned only when strictly better
            assert mine < min(s[i] for s in singles) or (
                mine == pytest.approx(min(s[i] for s in singles))
                and (got.predicted_latency_ms, got.bottleneck_ms)[i]
                < min(s[1 - i] for s in singles if s[i] == pytest.approx(mine)))
        compared += 1
    assert compared > 150


# ----- on a real model's facts ------------------------------------------------------------
@pytest.fixture(scope="module")
def alexnet():
    """AlexNet's profile rows and split points at 64x64 (22 layers, 244 MB of fp32 params)."""
    torch = pytest.importorskip("torch")
    split = pytest.importorskip("experiment_design.split")
    torch.set_num_threads(1)
    sm = split.build_split_model("alexnet", input_shape=(3, 64, 64))
    return sm.profile(), [dataclasses.asdict(p) for p in sm.points]


@pytest.fixture(scope="module")
def facts(alexnet):
    return ModelFacts.from_rows(*alexnet)


def flops_ms(layers, gflops_per_s):
    """A device doing ``gflops_per_s`` GFLOP/s plus 20 us per layer."""
    return [(r["flops"] or 0) / (gflops_per_s * 1e6) + 0.02 for r in layers]


def cluster(layers, speeds, memory=None):
    return {name: DeviceFacts(name, flops_ms(layers, g), memory) for name, g in speeds.items()}


def test_model_facts_from_profile_rows(alexnet, facts):
    layers, points = alexnet
    assert facts.n == len(layers) == 22
    assert facts.crossing_bytes[0] == 3 * 64 * 64 * 4  # the input crosses cut 0
    assert facts.param_bytes[16] == 151_011_328  # classifier.1
    assert facts.output_bytes == 4000 and all(facts.valid)


def test_slow_links_keep_everything_on_the_source(alexnet, facts):
    devices = cluster(alexnet[0], {"pi": 1, "gpu-1": 50, "gpu-2": 50})
    slow = full_mesh(devices, LinkFacts(1_000, 5.0))  # 1 kB/s
    for objective in ("throughput", "latency"):
        got = plan_pipeline(facts, devices, slow, "pi", objective)
        assert got.chain == ("pi",) and got.cuts == ()
        assert got.reason.startswith("splitting does not pay")
        assert got.predicted_latency_ms == pytest.approx(sum(devices["pi"].layer_ms))


def test_a_fast_link_sends_the_input_to_the_fast_device(alexnet, facts):
    devices = cluster(alexnet[0], {"pi": 1, "gpu": 50})
    got = plan_pipeline(facts, devices, full_mesh(devices, LinkFacts(1e9, 0.1)), "pi", "latency")
    assert got.chain == ("pi", "gpu") and got.cuts == (0,) and got.stages[0].layers == 0
    assert got.reason.startswith("splitting does not pay")  # one device computes


def test_a_slow_host_gets_little_and_the_dp_beats_proportional(alexnet, facts):
    layers = alexnet[0]
    devices = cluster(layers, {"a": 10, "slow": 1, "b": 10, "c": 10}, memory=300 * MB)
    links = full_mesh(devices, LinkFacts(100 * MB, 0.5))
    got = plan_pipeline(facts, devices, links, "a", "throughput")
    assert got.computing_devices >= 2 and "splitting does not pay" not in got.reason
    total = sum(r["flops"] or 0 for r in layers)
    for s in got.stages:
        if s.device == "slow":
            assert sum(r["flops"] or 0 for r in layers[s.first - 1: s.last]) < 0.1 * total
    # links as a function: the same plan
    same = plan_pipeline(facts, devices, lambda a, b: LinkFacts(100 * MB, 0.5), "a")
    assert same == got
    naive = proportional_placement(facts, devices, ["a", "slow", "b", "c"], links)
    assert got.predicted_throughput_per_s > 1.5 * naive.predicted_throughput_per_s
    # and the DP is at least as good as every cut tuple of every order of its devices
    for chain in permutations(got.chain[1:]):
        for p in enumerate_placements(facts, [got.chain[0], *chain], links, devices):
            assert got.bottleneck_ms <= p.bottleneck_ms * (1 + 1e-9)


def test_memory_limits_force_a_split_and_are_respected(alexnet, facts):
    devices = cluster(alexnet[0], {"a": 10, "b": 10, "c": 10}, memory=160 * MB)
    links = full_mesh(devices, LinkFacts(100 * MB, 0.5))
    for objective in ("throughput", "latency"):
        got = plan_pipeline(facts, devices, links, "a", objective)
        # classifier.1 alone is 151 MB, the whole model 244 MB: three stages are needed
        assert got.computing_devices == 3
        assert max(got.memory_bytes) <= 160 * MB and fits_memory(facts, got.stages, devices)
        assert "fits no single device" in got.reason
    with pytest.raises(TracrError, match="fits"):
        plan_pipeline(facts, devices, links, "a", max_stages=2)
    tiny = cluster(alexnet[0], {"a": 10, "b": 10, "c": 10}, memory=100 * MB)
    with pytest.raises(TracrError, match="fits") as err:
        plan_pipeline(facts, tiny, links, "a")
    assert err.value.hint


def test_invalid_cuts_are_never_boundaries(alexnet, facts):
    ok = {3, 6, 13, 17, 20}
    model = dataclasses.replace(facts, valid=tuple(k in ok for k in range(facts.n + 1)))
    rng = random.Random(7)
    for _ in range(30):
        devices = cluster(alexnet[0], {d: rng.choice([1, 5, 20, 50]) for d in "abcd"},
                          memory=rng.choice([None, 160 * MB, 200 * MB]))
        links = full_mesh(devices, LinkFacts(rng.choice([1e6, 1e7, 1e8]), 0.5))
        for objective in ("throughput", "latency"):
            try:
                got = plan_pipeline(model, devices, links, "a", objective)
            except TracrError:
                continue
            assert set(got.cuts) <= ok, got.cuts  # cut 0 is invalid too: no forwarding


def test_exhaustive_enumerates_every_tuple_of_valid_cuts_the_source_forwarding_included(
        alexnet, facts):
    """Cut 0 (the source only forwards the input) is a placement the DP may choose, so the
    oracle measures it too (before, its tuples began at the first interior cut and a
    runner refused ``cuts: [[0, 58]]``, a plan pipeline-dp had chosen)."""
    model = dataclasses.replace(facts, valid=tuple(k % 4 != 2 for k in range(facts.n + 1)))
    cuts = [k for k in range(0, model.n) if model.valid[k]]
    assert cuts[0] == 0
    devices = cluster(alexnet[0], {"a": 2, "b": 10, "c": 20})
    links = full_mesh(devices, LinkFacts(1e7, 1.0))
    for k in (1, 2, 3):
        got = enumerate_placements(model, ["a", "b", "c"][:k], links, devices)
        assert len(got) == count_placements(model, k) == math.comb(len(cuts), k - 1)
        assert [p.cuts for p in got] == list(combinations(cuts, k - 1))
        assert all(p.chain == ("a", "b", "c")[:k] for p in got)
    forwarding = [p for p in enumerate_placements(model, ["a", "b", "c"], links, devices)
                  if p.cuts[0] == 0]
    assert forwarding and all(p.stages[0].last == 0 for p in forwarding)
    # where cut 0 is not valid, no tuple starts there
    no_zero = dataclasses.replace(model, valid=(False, *model.valid[1:]))
    got = enumerate_placements(no_zero, ["a", "b", "c"], links, devices)
    assert len(got) == math.comb(len(cuts) - 1, 2) and all(p.cuts[0] > 0 for p in got)
    # memory leaves tuples out; a chain over a missing link is an error
    small = cluster(alexnet[0], {"a": 2, "b": 10, "c": 20}, memory=160 * MB)
    assert 0 < len(enumerate_placements(model, ["a", "b", "c"], links, small)) < math.comb(
        len(cuts), 2)
    with pytest.raises(TracrError, match="No link"):
        enumerate_placements(model, ["a", "b"], {("a", "b"): LinkFacts(1e6)}, devices)


def test_context_and_placement_cross_a_json_channel(alexnet, facts):
    devices = cluster(alexnet[0], {"a": 2, "b": 10, "c": 20}, memory=200 * MB)
    links = full_mesh(devices, LinkFacts(5e6, 2.0))
    del links[("c", "b")]
    pctx = PipelineContext(facts, devices, links, "a")
    wire = json.loads(json.dumps(pctx.to_dict()))
    assert PipelineContext.from_dict(wire) == pctx
    rows = {**wire, "model": {"layers": alexnet[0], "points": alexnet[1]}}
    assert PipelineContext.from_dict(rows).model == facts
    planner = create_partitioner("pipeline-dp", objective="throughput", batch=4)
    [p] = planner.plan(wire)
    assert Placement.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    assert p.batch == 4 and p.predicted_samples_per_s == pytest.approx(
        4 * p.predicted_throughput_per_s)
    assert planner.decision()["placement"]["cuts"] == list(p.cuts)
    with pytest.raises(TracrError, match="source"):
        PipelineContext.from_dict({**wire, "source": "zz"})


# ----- the registered partitioners --------------------------------------------------------
def edge_cloud_ctx(alexnet, bandwidth, edge_g=2, cloud_g=40):
    layers, points = alexnet
    return PartitionContext(
        layers=layers, points=points, valid_splits=[p["index"] for p in points if p["valid"]],
        edge_profile={"layer_ms": flops_ms(layers, edge_g)},
        cloud_profile={"layer_ms": flops_ms(layers, cloud_g)},
        network={"bandwidth_Bps": bandwidth, "rtt_ms": 1.0},
    )


def test_registered_and_k2_next_split_is_the_plans_cut(alexnet):
    assert {"pipeline-dp", "exhaustive"} <= set(list_partitioners())
    n = len(alexnet[0])
    chosen: dict[str, list[int]] = {}
    for objective in ("throughput", "latency"):
        for bw in (1e3, 1e5, 4e6, 1e9):
            ctx = edge_cloud_ctx(alexnet, bw)
            part = create_partitioner("pipeline-dp", objective=objective)
            part.setup(ctx)
            k = part.next_split()
            dec = json.loads(json.dumps(part.decision()))
            assert dec["chosen"] == k and len(dec["predicted"]) == len(ctx.valid_splits)
            [p] = part.plan(ctx)
            assert k == (n if len(p.stages) == 1 else p.cuts[0]), (objective, bw, k, p.cuts)
            chosen.setdefault(objective, []).append(k)
    # a slow link: all on the edge; a fast one: latency sends the input, while throughput
    # keeps the first conv on the edge, where it balances the two stages of the pipeline
    assert chosen["latency"][0] == chosen["throughput"][0] == n
    assert chosen["latency"][-1] == 0 and chosen["throughput"][-1] == 1
    # only the splits in the context are candidates (evaluate restricts them to measured ones)
    ctx = dataclasses.replace(edge_cloud_ctx(alexnet, 4e6), valid_splits=[3, 6])
    part = create_partitioner("pipeline-dp", objective="latency")
    part.setup(ctx)
    assert part.next_split() in (3, 6)


def test_exhaustive_walks_every_valid_split_like_cyclic(alexnet):
    ctx = edge_cloud_ctx(alexnet, 4e6)
    part = create_partitioner("exhaustive", repeats=2)
    part.setup(ctx)
    valid = ctx.valid_splits
    assert part.sweep_length() == 2 * len(valid)
    walk = [part.next_split() for _ in range(2 * len(valid) + 1)]
    assert walk == valid * 2 + [valid[0]]  # cyclic's default order: round-robin
    # plan() on the same context: every cut of edge -> cloud but the last (cut 0: the edge
    # forwards the input)
    plans = part.plan(ctx)
    assert [p.cuts for p in plans] == [(k,) for k in valid if k < len(alexnet[0])]


def test_exhaustive_plan_with_a_chain_and_stages(alexnet, facts):
    devices = cluster(alexnet[0], {"a": 2, "b": 10, "c": 20})
    pctx = PipelineContext(facts, devices, full_mesh(devices, LinkFacts(1e7, 1.0)), "a")
    # alexnet: 21 valid interior cuts, and cut 0
    assert len(create_partitioner("exhaustive", chain=["a", "c", "b"]).plan(pctx)) == math.comb(
        22, 2)
    assert len(create_partitioner("exhaustive", stages=2).plan(pctx)) == 22
    with pytest.raises(TracrError, match="source"):
        create_partitioner("exhaustive", chain=["b", "a"]).plan(pctx)


def test_exhaustive_cuts_measures_only_the_tuples_given_in_their_order(alexnet, facts):
    devices = cluster(alexnet[0], {"a": 2, "b": 10, "c": 20})
    pctx = PipelineContext(facts, devices, full_mesh(devices, LinkFacts(1e7, 1.0)), "a")
    every = {p.cuts: p for p in create_partitioner("exhaustive").plan(pctx)}
    got = create_partitioner("exhaustive", cuts=[[5, 12], [3, 7], [5, 12]]).plan(pctx)
    assert [p.cuts for p in got] == [(5, 12), (3, 7)]
    assert got[0] == every[(5, 12)]  # the same placement, predictions included
    with pytest.raises(TracrError, match="not placements"):
        create_partitioner("exhaustive", cuts=[[12, 5]]).plan(pctx)
    with pytest.raises(TracrError, match="list of cut lists"):
        create_partitioner("exhaustive", cuts=[5, 12])


def test_pipeline_dp_chain_restricts_the_devices(alexnet, facts):
    devices = cluster(alexnet[0], {"a": 1, "b": 10, "c": 50})
    pctx = PipelineContext(facts, devices, full_mesh(devices, LinkFacts(1e8, 0.5)), "a")
    [p] = create_partitioner("pipeline-dp", chain=["a", "b"]).plan(pctx)
    assert set(p.chain) <= {"a", "b"}
    with pytest.raises(TracrError, match="unknown device"):
        create_partitioner("pipeline-dp", chain=["a", "zz"]).plan(pctx)


def test_k2_context_matches_the_profiles(alexnet):
    ctx = edge_cloud_ctx(alexnet, 4e6)
    pctx = from_partition_context(ctx)
    assert pctx.source == "edge" and set(pctx.devices) == {"edge", "cloud"}
    assert pctx.devices["edge"].layer_ms == pytest.approx(ctx.edge_profile["layer_ms"])
    assert pctx.links[("cloud", "edge")] == LinkFacts(4e6, 1.0)


def test_predict_scores_a_given_placement_and_rejects_broken_ones(alexnet, facts):
    devices = cluster(alexnet[0], {"a": 2, "b": 10, "c": 20})
    links = full_mesh(devices, LinkFacts(1e7, 1.0))
    got = plan_pipeline(facts, devices, links, "a")
    assert predict(facts, got.stages, devices, links, "a", reason=got.reason) == got
    n = facts.n
    broken = {
        "source": [Stage("b", 1, n)],
        "continue": [Stage("a", 1, 5), Stage("b", 7, n)],
        "end at": [Stage("a", 1, 5), Stage("b", 6, 9)],
        "twice": [Stage("a", 1, 5), Stage("b", 6, 9), Stage("a", 10, n)],
    }
    for why, stages in broken.items():
        with pytest.raises(TracrError, match=why):
            predict(facts, stages, devices, links, "a")
    no_cut_5 = dataclasses.replace(facts, valid=tuple(k != 5 for k in range(n + 1)))
    with pytest.raises(TracrError, match="cut 5 is not a valid boundary"):
        predict(no_cut_5, [Stage("a", 1, 5), Stage("b", 6, n)], devices, links, "a")


def test_a_quota_hosts_sustained_layer_times_take_their_shape_from_stall_free_runs():
    """At 0.1 core a profiled pass spans ~20 CFS periods and back-to-back passes can stall on
    the same layers, so the medians put a stall into a few layers; pipeline-dp then took a
    stall-free run of layers for cheap and gave the 0.1-core host 69% of mobilenet_v2
    (seen in CI). Each layer's fastest run is its share of the work."""
    from experiment_design.partitioners.pipeline_partitioners import device_from_profile

    quota = {"quota_ms": 1.0, "period_ms": 10.0, "fraction": 0.1, "source": "lab"}
    profile = {"layers": {"1": 1.0, "2": 1.0, "3": 10.0, "4": 1.0},  # a stall on layer 3
               "layers_min": {"1": 1.0, "2": 1.0, "3": 1.0, "4": 1.0},
               "full_ms": 40.0, "full_cpu_ms": 4.0, "cpu_quota": quota}
    rows = [{} for _ in range(4)]
    busy = device_from_profile("slow", profile, rows, sustained=True)
    assert busy.layer_ms == pytest.approx((10.0, 10.0, 10.0, 10.0))
    # without a quota (or for start-up latency) the medians stand, as before
    alone = device_from_profile("slow", profile, rows, sustained=False)
    assert alone.layer_ms == pytest.approx(tuple(40.0 * v / 13.0 for v in (1, 1, 10, 1)))
    free = device_from_profile("fast", {**profile, "cpu_quota": None}, rows, sustained=True)
    assert free.layer_ms == pytest.approx(tuple(40.0 * v / 13.0 for v in (1, 1, 10, 1)))


def test_a_paced_hosts_layer_shares_come_from_their_cpu_time_not_their_fastest_run():
    """Paced (the lab's --cpu-mode duty, 0.6 core in 1.2 ms slices of 2 ms), a layer longer
    than a slice is stopped in every run, so its fastest run keeps the stops while a short
    layer's does not: the fastest runs gave mobilenet_v2's layers 1..32 54% of the model,
    where they took 39% of it in the pipeline. The CPU time per layer has no stops in it."""
    from experiment_design.partitioners.pipeline_partitioners import device_from_profile

    quota = {"quota_ms": 1.2, "period_ms": 2.0, "fraction": 0.6, "source": "lab",
             "measured": 0.6, "mode": "duty"}
    profile = {"layers": {"1": 5.0, "2": 0.2, "3": 0.2},
               "layers_min": {"1": 4.6, "2": 0.1, "3": 0.1},  # layer 1 always stopped
               "layers_cpu": {"1": 2.0, "2": 0.1, "3": 0.1},
               "full_ms": 3.7, "full_cpu_ms": 2.2, "cpu_quota": quota}
    rows = [{} for _ in range(3)]
    busy = device_from_profile("paced", profile, rows, sustained=True)
    assert busy.layer_ms == pytest.approx(tuple(3.7 * v / 2.2 for v in (2.0, 0.1, 0.1)))
    older = {k: v for k, v in profile.items() if k != "layers_cpu"}  # an older profile
    assert device_from_profile("paced", older, rows, sustained=True).layer_ms == pytest.approx(
        tuple(3.7 * v / 4.8 for v in (4.6, 0.1, 0.1)))


def test_what_a_stage_spends_beside_its_layers_weighs_as_its_layers_do():
    """The start-up profile times layers only. A 0.1-core lab host given layers 34..42 of
    mobilenet_v2 (predicted 7.0 ms) ran them in 17.7 ms per inference, and pipeline-dp had
    given it work for that price (14.5% of the FLOPs where the test allows 10%, seen
    once): receiving, relaying and its threads cost it ~1.9 ms of CPU per inference, 19 ms
    at 0.1 core. The probed overhead and the channel's CPU per byte become wall time at
    the rate the host's layers do, and a plan then leaves such a host out."""
    from experiment_design.partitioners.pipeline_partitioners import device_from_profile

    quota = {"quota_ms": 1.0, "period_ms": 10.0, "fraction": 0.1, "source": "lab"}
    slow = {"layers": {str(i): 1.0 for i in range(1, 5)}, "full_ms": 40.0,
            "full_cpu_ms": 4.0, "cpu_quota": quota}
    rows = [{} for _ in range(4)]
    dev = device_from_profile("slow", slow, rows, sustained=True, overhead_cpu_ms=1.5,
                              ns_per_byte=2.0)
    assert dev.layer_ms == pytest.approx((10.0,) * 4)  # 40 ms of wall for 4 ms of CPU
    assert dev.overhead_ms == pytest.approx(15.0)
    assert dev.byte_ms == pytest.approx(2.0e-6 * 10)
    # a host without a quota pays its CPU time as it is; without a per-byte figure (a
    # link probe that could not read the peer's clock) nothing is charged per byte
    fast = {"layers": {str(i): 1.0 for i in range(1, 5)}, "full_ms": 4.0, "full_cpu_ms": 4.0}
    quick = device_from_profile("fast", fast, rows, sustained=True, overhead_cpu_ms=0.5)
    assert (quick.overhead_ms, quick.byte_ms) == pytest.approx((0.5, 0.0))

    # three devices: the slow one's layers alone would make it worth a sliver
    n = 7
    model = ModelFacts(n=n, crossing_bytes=[1000] * (n + 1), valid=[True] * (n + 1),
                       param_bytes=[0] * n, output_bytes=100)
    links = full_mesh(["a", "b", "c"], LinkFacts(1e9, 0.0))
    layers = {"a": [3.0] * n, "b": [10.0] * n, "c": [3.0] * n}

    def plan(overhead: dict[str, float]):
        devs = {k: DeviceFacts(k, v, None, overhead[k]) for k, v in layers.items()}
        return plan_pipeline(model, devs, links, "a", "throughput")

    without = plan({"a": 0.0, "b": 0.0, "c": 0.0})
    assert "b" in without.chain  # 9 | 10 | 9 ms with one layer on b beats 12 | 9...
    with_overhead = plan({"a": 1.0, "b": 15.0, "c": 1.0})
    assert "b" not in with_overhead.chain, with_overhead  # ...not once b pays 15 ms more
    assert with_overhead.overhead_ms == pytest.approx((1.0, 1.0))
    assert with_overhead.bottleneck_ms == pytest.approx(12.0 + 1.0, abs=0.01)  # + 1 us on the wire


def test_with_passes_in_flight_a_stage_sends_while_it_computes():
    """In throughput mode a stage's sending thread overlaps its next pass's compute: in
    the lab (AlexNet, 3 hosts at 0.6 core, 32 MB/s) the head ran layers 1..13 and sent
    37 KB (1.2 ms on the wire) every 18.9-22.9 ms in eight runs, while the sum of compute,
    overhead and transfer predicted 23.3-24.5 ms. A throughput plan's stage
    time is the slower of its CPU work and its transfer; a latency plan's is their sum."""
    n = 2
    model = ModelFacts(n=n, crossing_bytes=[0, 100_000, 0], valid=[False, True, False],
                       param_bytes=[0, 0], output_bytes=0)
    devs = {"a": DeviceFacts("a", [10.0, 50.0], None, 1.0),
            "b": DeviceFacts("b", [50.0, 10.0], None, 1.0)}
    links = full_mesh(["a", "b"], LinkFacts(50 * MB, 0.0))  # 100 KB: 2 ms on the wire
    busy = plan_pipeline(model, devs, links, "a", "throughput")
    assert busy.cuts == (1,)
    assert busy.stage_ms == pytest.approx((11.0, 11.0))  # the 2 ms transfer overlaps
    assert busy.predicted_latency_ms == pytest.approx(13.0 + 11.0)
    one = plan_pipeline(model, devs, links, "a", "latency")
    assert one.stage_ms == pytest.approx((13.0, 11.0))
    # a transfer longer than the CPU work is the stage's time
    slow_link = full_mesh(["a", "b"], LinkFacts(5 * MB, 0.0))  # 20 ms on the wire
    assert predict(model, busy.stages, devs, slow_link, "a").stage_ms == pytest.approx(
        (20.0, 11.0))


def test_the_cpu_a_byte_costs_is_fitted_across_the_probe_routes():
    """The overhead probe runs two routes (cuts spread evenly; the cuts where the least
    crosses) and fits each member's fixed CPU and one per-byte slope. Measured in the lab
    (AlexNet, 32 MB/s): the head spent 1.22 ms beside its layers sending 260 KB and 0.43
    ms sending 16 KB, where the link probe's 0.5-1.5 ns/B would put 0.1-0.4 ms on 260 KB."""
    from experiment_design.roles.chain_probes import fit_overheads, moved_bytes
    from experiment_design.runtime.chain import Route

    truth = {"head": 0.3, "mid": 0.9, "last": 0.6}
    ns = 4.0
    xs = {"head": (260_000, 16_000), "mid": (300_000, 33_000), "last": (41_000, 20_000)}
    points = {k: [(x, truth[k] + ns * x / 1e6) for x in v] for k, v in xs.items()}
    fixed, slope = fit_overheads(points)
    assert slope == pytest.approx(ns)
    assert fixed == pytest.approx(truth)
    # a negative fixed part is clamped; no spread in the bytes or no positive slope: no fit
    assert fit_overheads({"a": [(1e5, 0.1), (2e5, 0.9)]})[0]["a"] == 0.0
    assert fit_overheads({"a": [(1e5, 0.5), (1e5, 0.7)]}) is None
    assert fit_overheads({"a": [(1e5, 0.9), (2e5, 0.5)]}) is None
    assert fit_overheads({"a": [(1e5, 0.9)]}) is None
    # the bytes each member moves, as the planner counts them: the head sends its cut,
    # the last member receives its cut and sends the output back
    model = ModelFacts(n=4, crossing_bytes=[10, 20, 30, 40, 50], valid=[True] * 5,
                       param_bytes=[0] * 4, output_bytes=5)
    assert moved_bytes(Route(("h", "m", "l"), (1, 3)), model) == {"h": 20, "m": 60, "l": 45}


def test_a_busy_stage_is_planned_at_the_cpu_its_layers_take_in_flight():
    """A quota'd lab host busy all the time is stopped every period: mobilenet_v2's stages
    took 1.36-1.55x their profiled CPU in throughput mode, 1.07-1.25x one inference at a
    time, and pipeline-dp predicted 1.34-1.36x what it measured. The busy probe's factor
    scales a device's sustained layer times; a latency plan (not sustained) ignores it."""
    from experiment_design.partitioners.pipeline_partitioners import device_from_profile

    quota = {"quota_ms": 6.0, "period_ms": 10.0, "fraction": 0.6, "source": "lab",
             "measured": 0.6}
    profile = {"layers": {"1": 2.0, "2": 2.0}, "layers_cpu": {"1": 1.0, "2": 1.0},
               "full_ms": 2.0, "full_cpu_ms": 2.0, "cpu_quota": quota}
    rows = [{}, {}]
    plain = device_from_profile("a", profile, rows, sustained=True)
    busy = device_from_profile("a", profile, rows, sustained=True, busy_factor=1.3)
    assert plain.layer_ms == pytest.approx((1.0 / 0.6, 1.0 / 0.6))
    assert busy.layer_ms == pytest.approx(tuple(1.3 * v for v in plain.layer_ms))
    alone = device_from_profile("a", profile, rows, busy_factor=1.3)
    assert alone.layer_ms == device_from_profile("a", profile, rows).layer_ms


def _lab_host(name: str, ms: list[float], alone: float = 0.6, together: float = 0.55,
              cpus: int | None = 2) -> DeviceFacts:
    return DeviceFacts(name, ms, cores=alone, uncontended=alone / together, machine_cpus=cpus)


def test_a_plan_that_leaves_lab_hosts_idle_runs_its_bottleneck_at_the_alone_share():
    """Three lab hosts of 0.6 core share two CPUs: all busy, each got 0.54-0.57 of a core,
    alone 0.60. Planned at the all-busy share, AlexNet's head (cuts 16/17) was predicted at
    23.3 ms and ran at 0.596 of a core (21.5 ms a pass) while the other two hosts were busy
    54% and 31% of the time: predicted over measured 0.906. Regression: the plan's times
    ignored how busy it keeps the other hosts (the gains did not exist)."""
    from experiment_design.partitioners.pipeline import contention_gains

    hosts = [_lab_host("e", [1.0]), _lab_host("s", [1.0]), _lab_host("c", [1.0])]
    u = hosts[0].uncontended
    # every host busy: the all-busy share is right
    assert contention_gains(hosts, [20.0 * u] * 3, 20.0) == pytest.approx([1.0] * 3)
    # the others idle: the bottleneck runs at its alone share, the others gain too
    gains = contention_gains(hosts, [20.0, 1.0, 1.0], 20.0)
    assert gains[0] == pytest.approx(u, rel=2e-3) and all(1 < g <= u for g in gains)
    # in between: at most the alone share, at least the all-busy one
    mid = contention_gains(hosts, [20.0, 12.0, 7.0], 20.0)
    assert 1.0 < mid[0] < u
    # two hosts on two CPUs never contend; a device that is not limited neither gains nor
    # counts; a machine with more CPUs than the others needs none
    assert contention_gains(hosts[:2], [20.0 * u] * 2, 20.0) == pytest.approx([u, u])
    free = DeviceFacts("free", [1.0])
    assert contention_gains([free, *hosts[1:]], [20.0 * u] * 3, 20.0)[0] == 1.0
    assert contention_gains([_lab_host(h.name, [1.0], cpus=4) for h in hosts],
                            [20.0 * u] * 3, 20.0) == pytest.approx([u] * 3)


def test_the_contention_gains_shorten_a_throughput_plan_and_never_a_latency_one():
    model = ModelFacts(n=3, valid=(True,) * 4, crossing_bytes=(0,) * 4, param_bytes=(0,) * 3,
                       output_bytes=0)
    shared = {n: _lab_host(n, ms) for n, ms in (("e", [22.0, 0, 0]), ("s", [0, 12.0, 0]),
                                                ("c", [0, 0, 7.0]))}
    plain = {n: DeviceFacts(n, d.layer_ms) for n, d in shared.items()}
    links = full_mesh(shared, LinkFacts(1e9, 0.0))
    stages = chain_stages(["e", "s", "c"], [1, 2], 3)
    fast = predict(model, stages, shared, links, "e", "throughput")
    slow = predict(model, stages, plain, links, "e", "throughput")
    u = shared["e"].uncontended
    assert slow.bottleneck_ms / u < fast.bottleneck_ms < slow.bottleneck_ms
    assert fast.compute_ms[0] == pytest.approx(fast.bottleneck_ms)
    # one pass at a time: the planned times (not sustained, so never scaled)
    assert predict(model, stages, shared, links, "e", "latency").predicted_latency_ms == \
        pytest.approx(predict(model, stages, plain, links, "e", "latency").predicted_latency_ms)
    # the head alone: nothing contends, the alone share
    alone = predict(model, [Stage("e", 1, 3)], shared, links, "e", "throughput")
    assert alone.bottleneck_ms == pytest.approx(22.0 / u)
    # the facts survive their JSON form
    d = shared["e"]
    assert DeviceFacts.from_dict(json.loads(json.dumps(d.to_dict()))) == d


def test_a_lab_host_profile_gives_the_planner_its_two_shares():
    from experiment_design.partitioners.pipeline_partitioners import device_from_profile

    quota = {"quota_ms": 6.0, "period_ms": 10.0, "fraction": 0.6, "source": "lab",
             "measured": 0.6, "measured_together": 0.55, "machine_cpus": 2}
    profile = {"layers": {"1": 2.0, "2": 2.0}, "layers_cpu": {"1": 1.0, "2": 1.0},
               "full_ms": 2.0, "full_cpu_ms": 2.0, "cpu_quota": quota}
    dev = device_from_profile("a", profile, [{}, {}], sustained=True)
    assert dev.layer_ms == pytest.approx((1.0 / 0.55, 1.0 / 0.55))
    assert (dev.cores, dev.machine_cpus) == (0.6, 2)
    assert dev.uncontended == pytest.approx(0.6 / 0.55)
    # one pass at a time, a paced host, or a lab that measured one share only: no gains
    assert device_from_profile("a", profile, [{}, {}]).uncontended == 1.0
    paced = {**profile, "cpu_quota": {**quota, "mode": "duty"}}
    assert device_from_profile("a", paced, [{}, {}], sustained=True).cores is None
    quota.pop("measured_together")
    assert device_from_profile("a", profile, [{}, {}], sustained=True).cores is None
