"""Declared partitioner and dataset parameters are checked by `tracr experiment validate`,
before any device is touched (each of these passed validate and failed after deploy)."""

from __future__ import annotations

import pytest

import app
from experiment_design.params import Param, declared, problems
from experiment_design.partitioners import get_partitioner


@pytest.mark.parametrize("override, says", [
    ("partitioner.params.repeats=abc", "partitioner.params.repeats: must be an integer"),
    ("partitioner.params.repeats=-3", "partitioner.params.repeats: must be >= 1, got -3"),
    ("dataset.params.limit=0", "dataset.params.limit: must be >= 1, got 0"),
    ("+partitioner.params.order=random", "'random' is not allowed"),
])
def test_a_bad_parameter_value_is_refused_by_validate(override, says, capsys):
    code = app.main(["experiment", "validate", "alexnet-sweep", "--set", override])
    err = capsys.readouterr().err
    assert code == 2
    assert "manifests/alexnet-sweep.yaml" in err and says in err


def test_good_values_and_undeclared_parameters_pass(capsys):
    code = app.main(["experiment", "validate", "alexnet-sweep", "--set",
                     "partitioner.params.repeats=5", "--set", "+partitioner.params.splits=[0,3]",
                     "--set", "dataset.params.limit=null"])
    assert code == 0, capsys.readouterr().err


def test_show_prints_what_the_partitioner_and_dataset_declare(capsys):
    assert app.main(["experiment", "show", "alexnet-sweep"]) == 0
    out = capsys.readouterr().out
    assert "# partitioner cyclic declares:" in out
    assert "#   repeats: int; default 1; >= 1" in out
    assert "#   limit: int or null; default None; >= 1" in out


def test_param_checks():
    p = Param("number", min=0, max=1)
    assert p.problem(0.5) is None and p.problem(True) and p.problem(float("nan"))
    assert Param("int", nullable=True).problem(None) is None
    assert "null" in Param("int").problem(None)
    assert problems(get_partitioner("cyclic"), {"repeats": 0, "splits": "all"}) == [
        ("repeats", "must be >= 1, got 0")]
    assert set(declared(get_partitioner("cyclic"))) >= {"repeats", "order", "race"}
