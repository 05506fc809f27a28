"""Graph fingerprints: partners with different torch versions interoperate when their graphs agree."""

from __future__ import annotations

import json

import pytest
import torch

from app_api.runner.compat import check_graphs
from experiment_design.protocol import GraphPlan, SetupInfo
from experiment_design.split import build_split_model
from experiment_design.split.fingerprint import (
    GraphMismatch,
    check_graph,
    graph_digest,
    graph_nodes,
)

SHAPE = (3, 64, 64)  # small input: the fingerprint does not depend on the input size's cost


@pytest.fixture(scope="module")
def alexnet():
    sm = build_split_model("alexnet", input_shape=SHAPE)
    nodes = graph_nodes(sm)
    return sm, nodes, graph_digest(sm.mode, nodes)


def test_the_same_model_gives_the_same_fingerprint(alexnet):
    sm, nodes, digest = alexnet
    again = build_split_model("alexnet", input_shape=SHAPE, seed=7)  # other weights: same graph
    assert graph_digest(again.mode, graph_nodes(again)) == digest
    assert len(nodes) == sm.n
    assert nodes[0].startswith("1 features.0 Conv2d in=1x3x64x64 out=1x64x15x15")
    assert graph_digest("hooks", nodes) != digest  # the split mode is part of the plan
    other = build_split_model("alexnet", input_shape=(3, 96, 96))
    assert graph_digest(other.mode, graph_nodes(other)) != digest  # shapes are too


def test_a_mismatch_names_both_torch_versions_and_the_first_differing_node(alexnet):
    _, nodes, digest = alexnet
    theirs = list(nodes)
    theirs[6] = theirs[6].replace("cross=", "cross=extra,")  # another torch traced node 7 apart
    plan = GraphPlan(reference="edge-1", torch="2.3.1", digest=graph_digest("graph", theirs),
                     nodes=theirs)  # fmt: skip
    with pytest.raises(GraphMismatch) as info:
        check_graph("cloud-1", "2.14.1", digest, nodes, plan)
    msg = info.value.message
    assert "cloud-1" in msg and "edge-1" in msg
    assert "torch 2.14.1" in msg and "torch 2.3.1" in msg
    assert f"node 7: here '{nodes[6]}', in the plan '{theirs[6]}'" in msg
    assert "same torch and torchvision" in info.value.hint
    shorter = GraphPlan(reference="edge-1", torch="2.3.1", digest="0", nodes=nodes[:5])
    with pytest.raises(GraphMismatch, match="node 6: here .*, in the plan '\\(no such node\\)'"):
        check_graph("cloud-1", "2.14.1", digest, nodes, shorter)
    check_graph("cloud-1", "2.14.1", digest, nodes,  # agreeing graphs pass, whatever torch
                GraphPlan(reference="edge-1", torch="2.3.1", digest=digest, nodes=nodes))


def test_a_participant_refuses_a_plan_whose_graph_is_not_its_own():
    """The role's check_graph over its control surface, after a real set-up."""
    from experiment_design.roles import get_role

    torch.set_num_threads(1)
    cloud = get_role("cloud")(instance="cloud-1")
    try:
        cfg = {"instance": "cloud-1", "model": {"name": "alexnet", "mode": "auto"},
               "transport": {"codec": "zstd"}, "data_secret": "00" * 32, "threads": 1,
               "data_bind": "127.0.0.1"}  # fmt: skip
        info = SetupInfo.from_json(cloud.exposed_setup(json.dumps(cfg)))
        assert info.graph and len(info.graph_nodes) == info.n_layers
        same = GraphPlan(reference="edge-1", torch="2.0.0", digest=info.graph,
                         nodes=info.graph_nodes)  # fmt: skip
        assert json.loads(cloud.exposed_check_graph(same.to_json())) == "ok"
        nodes = list(info.graph_nodes)
        nodes[2] = nodes[2].replace("MaxPool2d", "AvgPool2d")
        other = GraphPlan(reference="edge-1", torch="2.0.0", digest="f" * 16, nodes=nodes)
        with pytest.raises(GraphMismatch, match=r"torch 2\.0\.0.*node 3: here '3 features\.2 "
                                                r"MaxPool2d.*in the plan '3 features\.2 AvgPool2d"):
            cloud.exposed_check_graph(other.to_json())
    finally:
        cloud.close()


def test_the_observer_asks_each_partner_and_falls_back_without_a_graph():
    infos = {"edge-1": SetupInfo(graph="aa", graph_nodes=["1 a"], profile=[{"name": "a"}]),
             "cloud-1": SetupInfo(graph="aa", graph_nodes=["1 a"], profile=[{"name": "a"}]),
             "old-1": SetupInfo(profile=[{"name": "b"}])}  # fmt: skip
    asked = []
    check_graphs(lambda inst, plan: asked.append((inst, plan)), infos,
                 {"edge-1": {"torch": "2.3.1"}}, [("edge-1", "cloud-1")])  # fmt: skip
    assert asked == [("cloud-1", GraphPlan(reference="edge-1", torch="2.3.1", digest="aa",
                                           nodes=["1 a"]))]  # fmt: skip
    from experiment_design.errors import TracrError

    with pytest.raises(TracrError, match="split the model differently"):
        check_graphs(lambda inst, plan: asked.append(inst), infos, {}, [("edge-1", "old-1")])
