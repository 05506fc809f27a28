"""Model registry: names, errors, weights, user models."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from experiment_design.errors import TracrError
from experiment_design.models import (
    UnknownModelError,
    create_model,
    discover,
    example_input,
    get_model_spec,
    list_models,
    unregister_model,
)

BUILTINS = {"alexnet", "vgg16", "resnet18", "resnet50", "mobilenet_v2", "efficientnet_b0"}


def test_builtins_are_registered_and_patterns_filter():
    assert BUILTINS <= set(list_models())
    assert list_models("resnet*") == ["resnet18", "resnet50"]


def test_unknown_name_lists_valid_names_and_closest_match():
    with pytest.raises(UnknownModelError) as info:
        create_model("resnet19")
    assert info.value.closest == "resnet18"
    assert "alexnet" in str(info.value)
    assert info.value.exit_code == 2


def test_unknown_torchvision_name():
    with pytest.raises(TracrError, match="resnett18|resnet18"):
        get_model_spec("torchvision:resnett18")


def test_random_init_is_seeded_and_in_eval_mode():
    a = create_model("alexnet", seed=3)
    b = create_model("alexnet", seed=3)
    c = create_model("alexnet", seed=4)
    assert not a.training
    wa, wb, wc = (m.features[0].weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert get_model_spec("alexnet").pretrained is False


def test_weights_from_a_local_state_dict(tmp_path):
    src = create_model("resnet18", seed=7)
    path = tmp_path / "r18.pth"
    torch.save(src.state_dict(), path)
    loaded = create_model("resnet18", seed=0, weights=str(path))
    assert torch.equal(loaded.conv1.weight, src.conv1.weight)
    assert get_model_spec("resnet18", weights=str(path)).pretrained is True


def test_mismatched_or_missing_weights_are_user_errors(tmp_path):
    path = tmp_path / "alex.pth"
    torch.save(create_model("alexnet").state_dict(), path)
    with pytest.raises(TracrError, match="do not match"):
        create_model("resnet18", weights=str(path))
    with pytest.raises(TracrError, match="not found"):
        create_model("resnet18", weights=str(tmp_path / "nope.pth"))


def test_torchvision_weights_name_never_downloads(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(TracrError) as info:
        create_model("resnet18", weights="IMAGENET1K_V1")
    assert "never downloads" in info.value.message
    assert str(tmp_path) in info.value.hint
    with pytest.raises(TracrError, match="unknown weights"):
        create_model("resnet18", weights="IMAGENET9K_V9")


def test_example_input_shape_and_seed():
    x = example_input("resnet18", batch=2, seed=1)
    assert x.shape == (2, 3, 224, 224)
    assert torch.equal(x, example_input("resnet18", batch=2, seed=1))


def test_yolo_without_ultralytics_gives_install_hint(monkeypatch):
    from experiment_design.models import registry

    monkeypatch.setattr(registry.MODELS, "_entries", dict(registry.MODELS._entries))
    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))
    monkeypatch.setattr(registry, "_MISSING", dict(registry._MISSING))
    unregister_model("yolov8n")
    registry.register_missing("yolov8n", "pip install tracr[yolo]")
    assert "yolov8n" not in list_models()
    with pytest.raises(TracrError) as info:
        create_model("yolov8n")
    assert "tracr[yolo]" in info.value.hint


def test_user_model_modules_are_imported_automatically(tmp_path, monkeypatch):
    pkg = tmp_path / "tracr_test_usermodels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tiny.py").write_text(
        textwrap.dedent(
            """
            from torch import nn
            from experiment_design.models import register_model

            @register_model("tiny-mlp-test", input_shape=(16,), description="test model")
            def tiny():
                return nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2))
            """
        )
    )
    (pkg / "broken.py").write_text("raise RuntimeError('user typo')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        imported = discover.import_model_modules([(pkg, "tracr_test_usermodels.")])
        assert imported == ["tracr_test_usermodels.tiny"]
        assert "tiny-mlp-test" in list_models()
        assert get_model_spec("tiny-mlp-test").input_shape == (16,)
        out = create_model("tiny-mlp-test")(example_input("tiny-mlp-test"))
        assert out.shape == (1, 2)
    finally:
        unregister_model("tiny-mlp-test")
        for mod in [m for m in sys.modules if m.startswith("tracr_test_usermodels")]:
            del sys.modules[mod]
