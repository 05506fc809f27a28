"""cyclic with ``transports``: every (split, transport) pair in turn, the pair's CodecConfig
exposed after each decision."""

from __future__ import annotations

import pytest

from experiment_design.errors import TracrError
from experiment_design.partitioners import PartitionContext, create_partitioner


def ctx(valid=(0, 1, 2, 3)) -> PartitionContext:
    points = [{"index": k, "layer": f"l{k}", "crossing_bytes": 100, "valid": True}
              for k in valid]
    return PartitionContext(layers=[], points=points, valid_splits=list(valid))


def walk(p, n: int) -> list[tuple[int, str | None]]:
    out = []
    for _ in range(n):
        k = p.next_split()
        out.append((k, None if p.transport is None else p.transport.codec))
    return out


def test_every_split_transport_pair_repeats_times_split_major_then_wraps():
    p = create_partitioner("cyclic", repeats=2, splits=[1, 3], order="sequential", transports=[
        {"codec": "zstd", "level": 1}, {"codec": "none", "level": 0, "filter": "none"}])
    p.setup(ctx())
    assert p.sweep_length() == 2 * 2 * 2
    assert walk(p, 10) == [(1, "zstd")] * 2 + [(1, "none")] * 2 + [(3, "zstd")] * 2 + \
        [(3, "none")] * 2 + [(1, "zstd")] * 2
    d = p.decision()
    assert d["transports"] == ["zstd-1", "raw"] and d["pairs"] == 4


def test_a_transport_restricted_to_some_splits_is_used_there_only():
    p = create_partitioner("cyclic", transports=[
        {"codec": "lz4"}, {"codec": "zstd", "level": 5, "splits": [0, 2]}])
    p.setup(ctx())
    assert p.sweep_length() == 6
    assert walk(p, 6) == [(0, "lz4"), (0, "zstd"), (1, "lz4"), (2, "lz4"), (2, "zstd"),
                          (3, "lz4")]


def test_without_transports_the_walk_and_transport_are_unchanged():
    p = create_partitioner("cyclic", repeats=1)
    p.setup(ctx())
    assert walk(p, 4) == [(0, None), (1, None), (2, None), (3, None)]
    assert "transports" not in p.decision()


@pytest.mark.parametrize("transports, words", [
    ({"codec": "zstd"}, "must be a list"),
    (["zstd"], "transports[0] must be a mapping"),
    ([{"codec": "zstd"}, {"codec": "brotli"}], "transports[1]"),
    ([{"codec": "zstd", "splits": "0"}], "splits must be a list"),
])
def test_bad_transports_are_refused_with_their_position(transports, words):
    with pytest.raises(TracrError) as err:
        create_partitioner("cyclic", transports=transports)
    assert words in str(err.value)


def test_transports_do_not_combine_with_refine_or_resume():
    with pytest.raises(TracrError, match="refine"):
        create_partitioner("cyclic", refine=2, transports=[{"codec": "lz4"}])
    with pytest.raises(TracrError, match="resume"):
        create_partitioner("cyclic", done={"0": 1}, transports=[{"codec": "lz4"}])
