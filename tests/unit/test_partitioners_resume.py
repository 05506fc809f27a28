"""Resuming a sweep in the partitioner layer: cyclic skips what an earlier run measured."""

from __future__ import annotations

from collections import Counter

import pytest

from experiment_design.errors import TracrError
from experiment_design.partitioners import PartitionContext, create_partitioner


def ctx(valid=(0, 1, 2, 3)) -> PartitionContext:
    points = [{"index": i, "layer": f"l{i}", "crossing_bytes": 10, "valid": True} for i in valid]
    return PartitionContext(layers=[], points=points, valid_splits=list(valid))


def issue(p, n: int) -> list[int]:
    return [p.next_split() for _ in range(n)]


@pytest.mark.parametrize("done", [{}, {0: 2}, {0: 2, 1: 1}, {"2": 4, "3": 3}, {0: 4, 1: 4, 2: 4}])
def test_each_split_ends_with_the_planned_count(done):
    p = create_partitioner("cyclic", repeats=2, done=done, passes=2)  # 2 x 2 = 4 per split
    p.setup(ctx())
    left = p.sweep_length()
    assert left == 16 - sum(done.values())
    got = Counter(issue(p, left))
    assert {k: got[k] + int(done.get(k, done.get(str(k), 0))) for k in range(4)} == \
        {k: 4 for k in range(4)}  # fmt: skip


def test_without_done_the_order_is_the_plain_walk():
    p = create_partitioner("cyclic", repeats=2, order="sequential")
    p.setup(ctx((0, 1, 2)))
    assert issue(p, 8) == [0, 0, 1, 1, 2, 2, 0, 0]
    q = create_partitioner("cyclic", repeats=2, done={0: 1}, order="sequential")
    q.setup(ctx((0, 1, 2)))
    assert q.sweep_length() == 5 and issue(q, 5) == [0, 1, 1, 2, 2]
    assert q.decision()["done"] == {"0": 1}


def test_done_counts_are_checked():
    with pytest.raises(TracrError):
        create_partitioner("cyclic", done={0: -1})
    with pytest.raises(TracrError):
        create_partitioner("cyclic", done=[1, 2])
    with pytest.raises(TracrError, match="refine"):
        create_partitioner("cyclic", refine=2, done={0: 1})
