"""Cyclic/fixed semantics and the partitioner registry (incl. a user module dropped in)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from experiment_design.errors import TracrError, UnknownNameError
from experiment_design.partitioners import (
    PartitionContext,
    Partitioner,
    create_partitioner,
    list_partitioners,
)


def ctx(valid=(0, 1, 2, 3, 5), n=5) -> PartitionContext:
    points = [
        {"index": k, "layer": f"l{k}", "crossing_bytes": 100 - k, "valid": k in valid}
        for k in range(n + 1)
    ]
    return PartitionContext(layers=[], points=points, valid_splits=list(valid))


def take(p: Partitioner, n: int) -> list[int]:
    return [p.next_split() for _ in range(n)]


def test_cyclic_sequential_repeats_each_split_then_advances_and_wraps():
    p = create_partitioner("cyclic", repeats=2, order="sequential")
    p.setup(ctx())
    assert p.sweep_length() == 10
    assert take(p, 12) == [0, 0, 1, 1, 2, 2, 3, 3, 5, 5, 0, 0]
    assert p.decision()["order"] == "sequential"


def test_cyclic_default_one_repeat_and_restricted_splits():
    p = create_partitioner("cyclic", splits=[3, 1])
    p.setup(ctx())
    assert p.sweep_length() == 2
    assert take(p, 5) == [3, 1, 3, 1, 3]
    assert p.decision()["allowed"] == [3, 1]


def test_cyclic_rejects_invalid_split_and_bad_repeats():
    p = create_partitioner("cyclic", splits=[4])
    with pytest.raises(TracrError, match="not valid"):
        p.setup(ctx())
    with pytest.raises(TracrError):
        create_partitioner("cyclic", repeats=0)


def test_cyclic_refine_measures_the_closest_splits_again_in_turn():
    p = create_partitioner("cyclic", repeats=2, refine=3, contenders=2, order="sequential")
    p.setup(ctx())  # valid splits 0, 1, 2, 3, 5
    assert p.sweep_length() == 5 * 2 + 2 * 3
    e2e = {0: [50.0, 60.0], 1: [20.0, 90.0], 2: [30.0, 31.0], 3: [40.0, 45.0], 5: [99.0, 1.0]}
    walk = []
    for _ in range(10):
        k = p.next_split()
        walk.append(k)
        p.observe(k, {"e2e_ms": e2e[k][walk.count(k) - 1], "error": ""})
    assert walk == [0, 0, 1, 1, 2, 2, 3, 3, 5, 5]
    # medians: 0: 55, 1: 55, 2: 30.5, 3: 42.5, 5: 50 -> the two lowest, each 3 more times
    assert take(p, 6) == [2, 3, 2, 3, 2, 3]
    assert p.decision()["contenders"] == [2, 3] and p.decision()["refine"] == 3
    assert take(p, 2) == [0, 0]  # then the next sweep starts over
    p.observe(0, {"e2e_ms": None, "error": "link failed"})  # failures are not kept
    assert p.e2e[0] == [50.0, 60.0]
    with pytest.raises(TracrError, match="refine"):
        create_partitioner("cyclic", refine=-1)


def test_cyclic_refine_without_measurements_keeps_the_walk_order():
    p = create_partitioner("cyclic", refine=1, contenders=3)
    p.setup(ctx())
    assert take(p, 8) == [0, 1, 2, 3, 5, 0, 1, 2]
    assert create_partitioner("cyclic", repeats=2).decision().get("refine") is None


def test_fixed_and_negative_index():
    p = create_partitioner("fixed", split=2)
    p.setup(ctx())
    assert take(p, 3) == [2, 2, 2] and p.sweep_length() is None
    last = create_partitioner("fixed", split=-1)
    last.setup(ctx())
    assert last.next_split() == 5
    with pytest.raises(TracrError):
        create_partitioner("fixed", split=4).setup(ctx())


def test_context_round_trip_keeps_measured_keys_as_ints():
    c = ctx()
    c.measured = {2: 10.0}
    d = c.to_dict()
    d["measured"] = {"2": 10.0}  # what JSON does to int keys
    assert PartitionContext.from_dict(d).measured == {2: 10.0}


def test_context_holds_the_head_setup_info_and_the_measurements_as_messages():
    import dataclasses

    from experiment_design.protocol import Measurements, SetupInfo

    info = SetupInfo(valid_splits=[0, 1, 2], points=[{"index": 0}], profile=[{"name": "a"}])
    measured = Measurements(network={"rtt_ms": 1.0}, measured={"1": 5.0}, links={"a>b": {}})
    c = PartitionContext(info=info, measurements=measured)
    assert (c.layers, c.points, c.valid_splits) == ([{"name": "a"}], [{"index": 0}], [0, 1, 2])
    assert c.network == {"rtt_ms": 1.0} and c.measured == {1: 5.0}
    assert c.measurements.links == {"a>b": {}}
    # what the dict form built, and contexts do not share what is set on one
    assert PartitionContext.from_dict(c.to_dict()).to_dict() == c.to_dict()
    other = dataclasses.replace(c, valid_splits=[1])
    other.network = None
    assert c.valid_splits == [0, 1, 2] and c.network == {"rtt_ms": 1.0}
    assert info.valid_splits == [0, 1, 2] and measured.network == {"rtt_ms": 1.0}


def test_registry_lists_builtins_and_rejects_unknown():
    names = list_partitioners()
    assert {"cyclic", "fixed"} <= set(names)
    with pytest.raises(UnknownNameError, match="cyclic"):
        create_partitioner("cyclik")


def test_user_module_in_package_is_discovered_by_name():
    import experiment_design.partitioners as pkg

    mod = f"usertest_{uuid.uuid4().hex[:8]}"
    path = Path(pkg.__file__).parent / f"{mod}.py"
    path.write_text(
        "from experiment_design.partitioners import Partitioner, register_partitioner\n"
        f"@register_partitioner('{mod}')\n"
        "class Last(Partitioner):\n"
        "    '''Always the last valid split.'''\n"
        "    def next_split(self):\n"
        "        return self.ctx.valid_splits[-1]\n"
    )
    try:
        assert mod in list_partitioners()
        p = create_partitioner(mod)
        p.setup(ctx())
        assert p.next_split() == 5
    finally:
        path.unlink()
        sys.modules.pop(f"experiment_design.partitioners.{mod}", None)
