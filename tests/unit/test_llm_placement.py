"""Placement of a language model's layers on hosts (experiment_design.partitioners.
llm_placement): the three policies on real figures, memory caps, and the choice of
fewer hosts when splitting does not pay. Pure functions: no torch, no processes."""

from __future__ import annotations

import itertools
import random

import pytest

from experiment_design.errors import TracrError
from experiment_design.partitioners.llm_placement import (
    Host,
    Link,
    Model,
    PlacementRefused,
    best_single,
    compare,
    equal_slices,
    memory_proportional,
    time_per_token,
    tracr_placement,
)

MB = 1_000_000
# Qwen2.5-0.5B in fp32: 24 layers of 14.9 M parameters, a 151936 x 896 embedding tied
# to the LM head (each end holds it), one token's hidden state (896 fp32) per cut, keys
# and values of 2 heads x 64 per layer per token
QWEN = Model.uniform(layers=24, layer_bytes=59.6 * MB, kv_bytes_per_token=2 * 2 * 64 * 4,
                     embed_bytes=544.5 * MB, head_bytes=544.5 * MB, cut_bytes=896 * 4)
GIGABIT = Link(rate_bytes_per_s=125 * MB, rtt_ms=0.2)


def lab(cap: float | None) -> list[Host]:
    """Two hosts of 0.6 core and one of 0.15 (4x slower), as the lab's 3 hosts."""
    fast = Host.uniform("lab-1", 24, 6.0, head_ms=20.0, cap=cap)
    return [fast, fast.scaled("lab-2", 1.0, cap), fast.scaled("lab-3", 4.0, cap)]


def test_a_model_that_fits_no_single_host_is_split_within_every_cap():
    hosts = lab(1200 * MB)  # the whole model needs about 2 GB
    assert best_single(QWEN, hosts, GIGABIT) is None
    p = tracr_placement(QWEN, hosts, GIGABIT)
    assert len(p.stages) > 1 and p.fits and p.check() is p
    assert all(s.memory_bytes <= 1200 * MB for s in p.stages)
    assert "fits no single host" in p.reason
    # the slow host gets the fewest layers, and not the LM head (the embedding, a lookup,
    # costs it nothing: it may hold that one)
    slow = next(s for s in p.stages if s.host == "lab-3")
    assert slow.b - slow.a == min(s.b - s.a for s in p.stages)
    assert p.stages[-1].host != "lab-3"
    # memory-proportional (equal caps: equal layers) gives the slow host a third of them
    mp = memory_proportional(QWEN, hosts, GIGABIT).check()
    assert [s.b - s.a for s in mp.stages] == [8, 8, 8]
    assert mp.ms_per_token / p.ms_per_token >= 1.5
    assert p.ms_per_token == pytest.approx(
        sum(s.compute_ms for s in p.stages) + p.transfer_ms)


def test_a_placement_that_does_not_fit_is_refused_with_the_figures():
    hosts = lab(900 * MB)
    # equal slices: each end holds 8 layers and the 544.5 MB embedding or LM head
    with pytest.raises(PlacementRefused, match=r"lab-1 \(layers 1\.\.8\) needs 1025\.5 MB, "
                                               r"cap 900\.0 MB; lab-3 \(layers 17\.\.24\)"):
        equal_slices(QWEN, hosts, GIGABIT).check()
    p = tracr_placement(QWEN, hosts, GIGABIT)  # fewer layers at the ends: it fits
    assert p.fits and p.stages[0].b < 8
    with pytest.raises(PlacementRefused, match=r"needs 2.*caps lab-1 500\.0 MB.*1500\.0 MB in all"):
        tracr_placement(QWEN, lab(500 * MB), GIGABIT)


def test_with_no_caps_and_a_slow_link_one_host_is_chosen_and_it_says_why():
    hosts = lab(None)
    slow_link = Link(rate_bytes_per_s=1 * MB, rtt_ms=20.0)
    p = tracr_placement(QWEN, hosts, slow_link)
    assert p.hosts == ["lab-1"] and p.cuts == [] and p.transfer_ms == 0
    assert p.ms_per_token == 24 * 6.0 + 20.0
    assert p.reason.startswith("one host (lab-1) is fastest")
    # the others split it anyway, and pay the link
    others = compare(QWEN, hosts, slow_link)
    assert others["equal-slices"].ms_per_token > p.ms_per_token
    assert others["memory-proportional"].hosts == ["lab-1", "lab-2", "lab-3"]


def test_a_split_that_pays_is_taken_and_an_unused_host_is_named():
    # a host five times as fast that cannot hold the whole model takes all the layers
    # its cap allows, a bigger one the rest; the slowest host is left out
    model = Model.uniform(layers=10, layer_bytes=100 * MB, kv_bytes_per_token=0,
                          embed_bytes=400 * MB, head_bytes=400 * MB, cut_bytes=4096)
    hosts = [Host.uniform("big", 10, 10.0, head_ms=5.0),
             Host.uniform("fast", 10, 2.0, head_ms=1.0, cap=1000 * MB),
             Host.uniform("slow", 10, 50.0, head_ms=30.0)]
    p = tracr_placement(model, hosts, GIGABIT)
    assert sorted(p.hosts) == ["big", "fast"] and p.fits
    assert next(s.b - s.a for s in p.stages if s.host == "fast") == 6  # all its cap allows
    assert "saves" in p.reason and "best single host (big" in p.reason
    assert "unused: slow" in p.reason


def test_tracr_is_never_slower_than_the_best_single_host_or_a_policy_that_fits():
    rng = random.Random(7)
    for _ in range(40):
        n = rng.randint(2, 9)
        model = Model(tuple(rng.randint(10, 90) * MB for _ in range(n)), (1024,) * n,
                      rng.randint(10, 200) * MB, rng.randint(10, 200) * MB,
                      tuple(rng.choice((2048, 8192, 65536)) for _ in range(n + 1)))
        hosts = [Host(f"h{i}", tuple(rng.uniform(1, 30) for _ in range(n)),
                      rng.uniform(0, 5), rng.uniform(0, 20),
                      rng.choice((None, rng.randint(100, 900) * MB)))
                 for i in range(rng.randint(1, 4))]
        link = Link(rng.choice((1, 10, 100)) * MB, rng.uniform(0, 30))
        try:
            p = tracr_placement(model, hosts, link)
        except PlacementRefused:
            assert best_single(model, hosts, link) is None
            continue
        assert p.fits
        rivals = [q for q in (best_single(model, hosts, link),
                              equal_slices(model, hosts, link),
                              memory_proportional(model, hosts, link)) if q and q.fits]
        # and every ordering of every subset with every cut: exhaustive on small cases
        if n <= 5 and len(hosts) <= 3:
            for k in range(1, len(hosts) + 1):
                for order in itertools.permutations(hosts, k):
                    for cuts in itertools.combinations(range(1, n), k - 1):
                        rivals.append(time_per_token(model, list(order), [0, *cuts, n],
                                                     link))
        assert all(p.ms_per_token <= q.ms_per_token + 1e-9 for q in rivals if q.fits)


def test_inputs_are_checked():
    with pytest.raises(TracrError, match="decode times for 3 layers; the model has 24"):
        tracr_placement(QWEN, [Host.uniform("a", 3, 1.0)], GIGABIT)
    with pytest.raises(TracrError, match="do not cover"):
        time_per_token(QWEN, lab(None)[:2], [0, 24], GIGABIT)
    facts = [{"layer": i + 1, "weight_bytes": 10, "kv_bytes_per_token": 4} for i in range(3)]
    m = Model.from_layer_facts(facts, embed_bytes=7, head_bytes=5, hidden=8)
    assert m.n == 3 and m.cut_bytes == (32,) * 4 and m.layer_bytes == (10, 10, 10)
    assert memory_proportional(m, [Host.uniform("a", 3, 1.0, memory=3 * MB),
                                   Host.uniform("b", 3, 1.0, memory=1 * MB)],
                               GIGABIT).cuts == [2]


def test_a_split_within_the_figures_resolution_keeps_one_host():
    # two hosts alike but for noise: one a little faster at the layers, the other at the
    # LM head; a split saves 0.6%, less than measured figures can tell apart
    a = Host("lab-1", (9.1,) * 24, 0.15, 64.9)
    b = Host("lab-2", (9.3,) * 24, 0.15, 62.9)
    link = Link(rate_bytes_per_s=2e9, rtt_ms=0.07)
    assert len(tracr_placement(QWEN, [a, b], link).stages) == 2
    p = tracr_placement(QWEN, [a, b], link, split_margin=0.03)
    assert p.hosts == ["lab-1"] and "within the figures' resolution (3.0%)" in p.reason
    # and it names the other host alone as a tie the figures cannot break
    assert "cannot tell them apart: lab-2 alone (" in p.reason
    wide = Host("lab-2", (12.0,) * 24, 0.15, 62.9)  # 30% slower alone: no tie
    assert "cannot tell" not in tracr_placement(QWEN, [a, wide], link, split_margin=0.03).reason
    # a split that saves more than the margin is still taken
    fast_head = Host("lab-2", (9.8,) * 24, 0.15, 30.0)  # the split saves 6%
    assert len(tracr_placement(QWEN, [a, fast_head], link, split_margin=0.03).stages) == 2
