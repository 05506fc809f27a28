"""`tracr model coverage` on a few real torchvision builders per family, through a real process."""

from __future__ import annotations

import json

import pytest

from app_api.model_coverage import FAMILIES, SplitCheck, builders, plan, sample_cuts
from experiment_design.errors import TracrError
from tests.unit.test_cli_model import _tracr  # `tracr ...` in a real process

FEW = {
    "resnet18": "classification",
    "mobilenet_v3_small": "classification",
    "lraspp_mobilenet_v3_large": "segmentation",
    "ssdlite320_mobilenet_v3_large": "detection",
    "fasterrcnn_mobilenet_v3_large_320_fpn": "detection",
}




@pytest.fixture(scope="module")
def report() -> dict:
    proc = _tracr("model", "coverage", "--models", ",".join(FEW), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_every_model_has_a_row_with_its_facts(report):
    rows = {r["model"]: r for r in report["models"]}
    assert list(rows) == list(FEW)
    for name, r in rows.items():
        assert r["family"] == FEW[name]
        assert r["part"] == ("backbone" if FEW[name] == "detection" else "model")
        assert r["status"] == "ok" and r["reason"] is None
        assert r["splits"] is True and r["exact"] is True
        assert r["mode"] == "graph"
        assert r["layers"] > 10 and r["cuts"] == r["layers"] + 1
        assert 0 < r["valid_cuts"] <= r["cuts"]
        assert r["worst_diff"] is not None and r["worst_diff"] <= 1e-5
        assert r["params"] > 0 and r["seconds"] > 0 and r["output_elements"] > 0
        assert len(r["input_shape"]) == 3


def test_inputs_are_the_smallest_the_family_tries(report):
    shapes = {r["model"]: r["input_shape"] for r in report["models"]}
    assert shapes["resnet18"] == [3, 64, 64]
    assert shapes["lraspp_mobilenet_v3_large"] == [3, 128, 128]
    assert shapes["ssdlite320_mobilenet_v3_large"] == [3, 224, 224]


def test_classifiers_have_every_cut_valid_and_sampled_ends(report):
    for r in report["models"]:
        if r["family"] != "classification":
            continue
        assert r["all_valid"] is True and r["valid_cuts"] == r["cuts"]
        assert r["sampled"][0] == 0 and r["sampled"][-1] == r["layers"]
        assert len(r["sampled"]) == 5


def test_detectors_report_the_whole_model_beside_the_backbone(report):
    for r in report["models"]:
        if r["family"] != "detection":
            assert r["detector"] is None
            continue
        det = r["detector"]
        assert det["error"] is None, det
        assert det["mode"] in ("graph", "hooks") and det["valid_cuts"] >= 1
        assert det["exact"] is True and det["worst_diff"] <= 1e-5
        # random weights: an R-CNN may find nothing, SSDlite keeps its top 300 boxes
        assert det["output_elements"] >= 0
    ssdlite = next(r for r in report["models"] if r["model"].startswith("ssdlite"))
    assert ssdlite["detector"]["output_elements"] > 0


def test_totals_per_family_meet_the_targets(report):
    totals = {t["family"]: t for t in report["totals"]}
    assert list(totals) == ["classification", "segmentation", "detection"]
    assert totals["classification"]["models"] == 2
    assert totals["detection"]["detector_split"] == 2
    for t in totals.values():
        assert t["met"] is True
        assert t["split"] == t["models"] and t["skipped"] == t["failed"] == 0
        assert 0 < t["valid_cuts"] <= t["cuts"]
        assert t["worst_diff"] <= 1e-5


@pytest.mark.slow
def test_a_parameter_cap_skips_with_the_reason_and_misses_the_target():
    proc = _tracr("model", "coverage", "--models", "resnet18", "--max-params", "1000", "--json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    (row,) = report["models"]
    assert row["status"] == "skipped" and "--max-params" in row["reason"]
    assert row["splits"] is False and row["mode"] is None
    (totals,) = report["totals"]
    assert totals["skipped"] == 1 and totals["met"] is False


@pytest.mark.slow
def test_an_unknown_builder_exits_2_naming_the_closest():
    proc = _tracr("model", "coverage", "--models", "resnet19")
    assert proc.returncode == 2
    assert "Did you mean 'resnet18'?" in proc.stderr and "Traceback" not in proc.stderr


def test_a_builder_of_another_family_is_refused():
    with pytest.raises(TracrError, match="segmentation builder") as err:
        plan(["classification"], ["fcn_resnet50"])
    assert "--family segmentation" in err.value.hint


def test_families_list_torchvision_builders():
    assert "resnet18" in builders("classification")
    assert "fcn_resnet50" not in builders("classification")
    assert set(builders("segmentation")) >= {"fcn_resnet50", "deeplabv3_resnet50"}
    assert "retinanet_resnet50_fpn" in builders("detection")
    assert len(plan(None, None)) == sum(len(builders(f)) for f in FAMILIES)


@pytest.mark.parametrize(
    "valid,count,expected",
    [
        ([], 5, []),
        ([3], 5, [3]),
        ([0, 1, 2], 5, [0, 1, 2]),
        (list(range(11)), 5, [0, 2, 5, 8, 10]),
        (list(range(11)), 2, [0, 10]),
        ([0, 4, 7, 9], 3, [0, 7, 9]),
    ],
)
def test_sample_cuts_spreads_and_keeps_the_ends(valid, count, expected):
    assert sample_cuts(valid, count) == expected


def test_only_the_cuts_0_and_n_is_no_split():
    # cut 0 runs everything on the far side and cut n everything on the near side
    trivial = SplitCheck(mode="graph", layers=9, cuts=10, valid_cuts=2, worst_diff=0.0)
    assert not trivial.splits() and not trivial.exact(1e-5)
    inner = SplitCheck(
        mode="graph", layers=9, cuts=10, valid_cuts=3, worst_diff=0.0, inner_cut=True
    )
    assert inner.splits() and inner.exact(1e-5) and not inner.all_valid()
