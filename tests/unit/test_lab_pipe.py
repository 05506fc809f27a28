"""The link emulator's stages without sockets or namespaces: loss, queue, rate, delay."""

from __future__ import annotations

import random

import pytest

from app_api.lab.pipe import (
    Bernoulli,
    GilbertElliott,
    Jitter,
    LinkConfig,
    Pipe,
    parse_fraction,
    parse_ge,
    parse_queue,
)
from experiment_design.errors import TracrError


def test_bernoulli_loses_its_rate_over_many_packets():
    loss = Bernoulli(0.01, random.Random(1))
    lost = sum(loss.lost() for _ in range(200_000))
    assert 0.0093 < lost / 200_000 < 0.0107


def test_gilbert_elliott_long_run_rate_and_bursts():
    ge = GilbertElliott(0.01, 0.3, h=0.0, k=1.0, rng=random.Random(2))
    seq = [ge.lost() for _ in range(300_000)]
    rate = sum(seq) / len(seq)
    assert ge.mean() == pytest.approx(0.01 / 0.31)
    assert rate == pytest.approx(ge.mean(), rel=0.08)
    # losses come in bursts of mean length 1/r
    bursts, run = [], 0
    for x in seq:
        if x:
            run += 1
        elif run:
            bursts.append(run)
            run = 0
    assert sum(bursts) / len(bursts) == pytest.approx(1 / 0.3, rel=0.1)


def test_gilbert_elliott_with_loss_in_both_states():
    ge = GilbertElliott(0.05, 0.2, h=0.5, k=0.99, rng=random.Random(3))
    rate = sum(ge.lost() for _ in range(300_000)) / 300_000
    assert ge.mean() == pytest.approx(0.2 * 0.5 + 0.8 * 0.01)
    assert rate == pytest.approx(ge.mean(), rel=0.06)


def test_parsers():
    assert parse_fraction("1%", "loss") == pytest.approx(0.01)
    assert parse_fraction("0.02", "loss") == 0.02
    with pytest.raises(TracrError):
        parse_fraction("120%", "loss")
    assert parse_ge("ge:1%,30%") == (0.01, 0.3, 0.0, 1.0)
    assert parse_ge("ge:0.01,0.3,0.1,0.99") == (0.01, 0.3, 0.1, 0.99)
    with pytest.raises(TracrError, match="cannot read the loss model"):
        parse_ge("ge:1%")
    assert parse_queue("100") == (None, 100)
    assert parse_queue("100p") == (None, 100)
    assert parse_queue("150KB") == (150_000, None)
    assert parse_queue("1MiB") == (1 << 20, None)
    with pytest.raises(TracrError):
        parse_queue("100B")


def test_fixed_rate_paces_back_to_back_frames():
    pipe = Pipe(LinkConfig(rate_Bps=1_514_000), epoch=0.0)  # 1000 full frames/s
    out = [pipe.offer(1.0, 1514) for _ in range(10)]
    assert out == pytest.approx([1.0 + 0.001 * (i + 1) for i in range(10)])
    # capacity that passed while the queue was empty is not saved up
    assert pipe.offer(5.0, 1514) == pytest.approx(5.001)


def test_drop_tail_queue_in_packets_and_bytes():
    pipe = Pipe(LinkConfig(rate_Bps=1514, queue_packets=3), epoch=0.0)
    got = [pipe.offer(0.0, 1514) for _ in range(5)]
    assert [g is not None for g in got] == [True, True, True, False, False]
    assert pipe.counts["queue_drops"] == 2
    # after the first left, one more fits
    assert pipe.offer(1.0, 1514) is not None
    bytes_pipe = Pipe(LinkConfig(rate_Bps=1000, queue_bytes=3000), epoch=0.0)
    got = [bytes_pipe.offer(0.0, 1000) for _ in range(4)]
    assert [g is not None for g in got] == [True, True, True, False]


def test_default_queue_is_deep_enough_for_a_tcp_window():
    pipe = Pipe(LinkConfig(rate_Bps=125_000), epoch=0.0)
    assert all(pipe.offer(0.0, 1514) is not None for _ in range(4 * 1024 * 1024 // 1514))


def test_delay_is_added_after_the_rate_and_never_reorders():
    pipe = Pipe(LinkConfig(rate_Bps=1_514_000, delay_ms=20), epoch=0.0)
    assert pipe.offer(0.0, 1514) == pytest.approx(0.021)
    jittery = Pipe(LinkConfig(delay_ms=20, jitter_ms=5, jitter_dist="normal"), epoch=0.0)
    times = [jittery.offer(i * 1e-4, 100) for i in range(5000)]
    assert times == sorted(times)
    # dense traffic: a packet waits behind an earlier one that drew a longer delay, so the
    # mean delay rises above 20 ms (as in netem without reordering)
    assert sum(t - i * 1e-4 for i, t in enumerate(times)) / 5000 > 0.025
    sparse = Pipe(LinkConfig(delay_ms=20, jitter_ms=5, jitter_dist="normal"), epoch=0.0)
    times = [sparse.offer(i * 0.1, 100) - i * 0.1 for i in range(5000)]
    assert min(times) >= 0
    assert sum(times) / 5000 == pytest.approx(0.02, abs=0.0005)


@pytest.mark.parametrize("dist", ["uniform", "normal", "pareto"])
def test_jitter_distributions_are_centred_with_the_asked_spread(dist):
    j = Jitter(0.002, dist, random.Random(4))
    xs = [j.sample() for _ in range(100_000)]
    mean = sum(xs) / len(xs)
    sd = (sum((x - mean) ** 2 for x in xs) / len(xs)) ** 0.5
    assert abs(mean) < 1e-4
    want = 0.002 / 3**0.5 if dist == "uniform" else 0.002
    assert sd == pytest.approx(want, rel=0.1 if dist != "pareto" else 0.2)  # a heavy tail
    if dist == "uniform":
        assert max(abs(x) for x in xs) <= 0.002


def test_loss_happens_before_the_queue():
    pipe = Pipe(LinkConfig(rate_Bps=1514, loss=0.5), epoch=0.0, seed=5)
    got = [pipe.offer(0.0, 1514) for _ in range(1000)]
    kept = [g for g in got if g is not None]
    # lost packets took no capacity: the kept ones leave one per second, back to back
    assert kept == pytest.approx([i + 1.0 for i in range(len(kept))])
    assert pipe.counts["lost"] == 1000 - len(kept)


def test_config_round_trips_through_a_dict():
    cfg = LinkConfig(rate_Bps=2e6, delay_ms=20, loss=0.01, ge=(0.01, 0.3, 0.0, 1.0),
                     queue_packets=100)
    assert LinkConfig.from_dict(cfg.to_dict()) == cfg
    assert not cfg.is_plain()
    assert LinkConfig(rate_Bps=1e6).is_plain()
    assert LinkConfig().is_empty()
