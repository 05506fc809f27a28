"""The observer refuses participants that cannot exchange tensors, before any inference."""

from __future__ import annotations

import pytest

from app_api.runner.client import remote_message
from app_api.runner.compat import check_environments, check_plans
from experiment_design.errors import TracrError


def env(**kw):
    base = {"tracr": "0.1.0", "python": "3.11.7", "torch": "2.4.1+cpu"}
    base.update(kw)
    return base


def test_same_versions_pass_and_torch_patch_differences_are_silent():
    assert check_environments({"a": env(), "b": env(torch="2.4.0")}) == []


def test_tracr_or_python_major_mismatch_is_refused():
    with pytest.raises(TracrError, match="different tracr versions"):
        check_environments({"a": env(), "b": env(tracr="0.2.0")})
    with pytest.raises(TracrError, match="different python"):
        check_environments({"a": env(), "b": env(python="4.0.0")})


def test_torch_minor_mismatch_warns():
    (w,) = check_environments({"a": env(), "b": env(torch="2.5.0")})
    assert "torch" in w


def test_different_split_plans_are_refused():
    infos = {"e": {"profile": [{"name": "conv", "type": "Conv2d"}]},
             "c": {"profile": [{"name": "conv", "type": "Conv2d"}, {"name": "fc", "type": "Linear"}]}}
    with pytest.raises(TracrError, match="split the model differently"):
        check_plans(infos, [("e", "c")])
    check_plans({"e": infos["e"], "c": infos["e"]}, [("e", "c")])


def test_remote_message_drops_the_remote_traceback():
    exc = RuntimeError("edge-1: ValueError: bad\n\n========= Remote Traceback (1) =========\nTrace")
    assert remote_message(exc) == "edge-1: ValueError: bad"
