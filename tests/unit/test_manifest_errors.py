"""Each kind of manifest mistake gives one ManifestError naming the file, key path and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from app_api.manifest import ManifestError, load_manifest, names
from experiment_design.errors import TracrError

GOOD = """\
description: test
model: {name: alexnet}
participant_types:
  edge:
    role: edge
    settings: {threads: 1}
  cloud:
    role: cloud
participant_instances:
  - {name: edge-1, type: edge, device: localhost}
  - {name: cloud-1, type: cloud}
playbook:
  edge-1:
    - {task: infer-dataset, params: {}}
    - {task: finish}
  cloud-1:
    - {task: wait}
partitioner: {name: cyclic, params: {repeats: 1}}
dataset: {name: sample, params: {limit: 2}}
transport: {codec: zstd, level: 1, filter: shuffle}
run: {warmup: 2, seed: 0}
"""


def error_for(tmp_path: Path, old: str, new: str, overrides=()) -> ManifestError:
    assert old in GOOD, old
    p = tmp_path / "bad.yaml"
    p.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(ManifestError) as e:
        load_manifest(str(p), overrides)
    err = e.value
    assert isinstance(err, TracrError) and err.exit_code == 2
    assert err.file and err.file.endswith("bad.yaml")
    assert err.message.startswith(err.file)
    return err


def need(registry) -> list[str]:
    names_ = registry()
    if names_ is None:
        pytest.skip(f"{registry.__name__} registry not installed")
    return names_


def test_good_manifest_loads(tmp_path):
    p = tmp_path / "good.yaml"
    p.write_text(GOOD)
    assert load_manifest(str(p)).participant_types["edge"]["settings"]["threads"] == 1


def test_unknown_key_has_line_and_valid_keys(tmp_path):
    err = error_for(tmp_path, "    role: edge\n", "    rol: edge\n")
    assert err.line == 5
    assert err.key == "participant_types.edge.rol"
    assert f"{err.file}:5: participant_types.edge.rol: unknown key 'rol'." in err.message
    assert "Did you mean 'role'?" in err.message
    assert "Valid keys: role, model, settings." in err.message


def test_unknown_top_level_key(tmp_path):
    err = error_for(tmp_path, "run: {warmup", "runn: {warmup")
    assert err.line == 21 and "Did you mean 'run'?" in err.message


def test_wrong_type(tmp_path):
    err = error_for(tmp_path, "warmup: 2", "warmup: two")
    assert err.line == 21 and err.key == "run.warmup"
    assert "must be an integer, not 'two' (a string)" in err.message
    err = error_for(tmp_path, "threads: 1", "threads: true")
    assert "must be an integer" in err.message and err.line == 6


def test_missing_required_key(tmp_path):
    err = error_for(tmp_path, "    role: cloud\n", "    settings: {}\n")
    assert (
        err.key == "participant_types.cloud.role" and "missing required key 'role'" in err.message
    )
    assert err.line == 7  # the line of the mapping that lacks it


def test_out_of_range_and_choices(tmp_path):
    assert "must be <= 9" in error_for(tmp_path, "level: 1", "level: 10").message
    err = error_for(tmp_path, "codec: zstd", "codec: gzip")
    assert "The valid options are [none, zstd, lz4, lz4hc, blosclz, zlib]" in err.message
    err = error_for(tmp_path, "filter: shuffle", "filter: bitshufle")
    assert "Did you mean 'bitshuffle'?" in err.message
    assert "must be >= 0" in error_for(tmp_path, "warmup: 2", "warmup: -1").message


def test_unknown_role(tmp_path):
    need(names.roles)
    err = error_for(tmp_path, "role: cloud", "role: clod")
    assert err.line == 8 and err.key == "participant_types.cloud.role"
    assert "Unknown role 'clod'. Did you mean 'cloud'?" in err.message
    assert "The valid options are [" in err.message


def test_unknown_task(tmp_path):
    need(names.tasks)
    err = error_for(tmp_path, "task: wait", "task: wiat")
    assert err.line == 17 and err.key == "playbook.cloud-1.0.task"
    assert "Unknown task 'wiat'. Did you mean 'wait'?" in err.message


def test_unknown_partitioner(tmp_path):
    need(names.partitioners)
    err = error_for(tmp_path, "name: cyclic", "name: cylic")
    assert err.line == 18 and "Unknown partitioner 'cylic'. Did you mean 'cyclic'?" in err.message
    err = error_for(tmp_path, "run: {", "evaluate: {partitioners: [cyclic, nope]}\nrun: {")
    assert err.key == "evaluate.partitioners.1"


def test_unknown_dataset_and_dataset_param(tmp_path):
    err = error_for(tmp_path, "name: sample", "name: imagenet")
    assert err.line == 19 and "Unknown dataset 'imagenet'" in err.message
    assert "sample" in err.message and "synthetic" in err.message
    err = error_for(tmp_path, "limit: 2", "limt: 2")
    assert err.key == "dataset.params.limt" and "Did you mean 'limit'?" in err.message
    err = error_for(tmp_path, "name: sample", "name: image-folder")
    assert "dataset 'image-folder' needs params.path" in err.message
    p = tmp_path / "folder.yaml"
    p.write_text(GOOD.replace("name: sample", "name: image-folder"))
    m = load_manifest(str(p), ["+dataset.params.path=/data/imgs"])
    assert m.dataset["params"]["path"] == "/data/imgs"


def test_unknown_model(tmp_path):
    need(names.models)
    err = error_for(tmp_path, "name: alexnet", "name: alexnt")
    assert err.line == 2 and "Unknown model 'alexnt'. Did you mean 'alexnet'?" in err.message
    assert "torchvision:" in err.hint


def test_torchvision_models_are_checked_by_name(tmp_path):
    p = tmp_path / "tv.yaml"
    p.write_text(GOOD.replace("name: alexnet", "name: torchvision:resnet34"))
    assert load_manifest(str(p)).model["name"] == "torchvision:resnet34"
    err = error_for(tmp_path, "name: alexnet", "name: torchvision:resnet34x")
    assert "Unknown torchvision model 'resnet34x'" in err.message


def test_unknown_device(tmp_path):
    need(names.devices)
    err = error_for(tmp_path, "device: localhost", "device: pi-1")
    assert err.line == 10 and err.key == "participant_instances.0.device"
    assert "Unknown device 'pi-1'" in err.message and "localhost" in err.message
    assert "tracr device pair" in err.hint


def test_cross_references(tmp_path):
    err = error_for(tmp_path, "type: edge,", "type: egde,")
    assert "Unknown participant type 'egde'. Did you mean 'edge'?" in err.message
    err = error_for(tmp_path, "  cloud-1:\n    - {task: wait}\n", "")
    assert "instance 'cloud-1' has no playbook entry" in err.message
    err = error_for(tmp_path, "  cloud-1:\n", "  cloud-2:\n")
    assert "Unknown participant instance 'cloud-2'" in err.message
    err = error_for(tmp_path, "{name: cloud-1, type", "{name: edge-1, type")
    assert "used twice" in err.message
    err = error_for(tmp_path, "{name: cloud-1,", "{name: cloud.1,")
    assert "not a valid name" in err.message


def test_yaml_problems(tmp_path):
    err = error_for(tmp_path, "run: {warmup: 2, seed: 0}", "run: {warmup: 2, seed: 0}\nrun: {}")
    assert err.line == 22 and "appears twice (first on line 21)" in err.message
    err = error_for(tmp_path, "dataset: {name", "dataset: [{name")
    assert "invalid YAML" in err.message and err.line is not None


def test_error_from_an_override_names_it(tmp_path):
    err = error_for(tmp_path, "x", "x", ["transport.level=12"])
    assert err.line is None and err.key == "transport.level"
    assert "(set by override 'transport.level=12')" in err.message


def test_lines_follow_list_items_moved_by_overrides(tmp_path):
    text = GOOD.replace("{name: cloud-1, type: cloud}", "{name: cloud-1, type: clod}")
    p = tmp_path / "moved.yaml"
    p.write_text(text)
    with pytest.raises(ManifestError) as e:
        load_manifest(str(p), ["~participant_instances.edge-1", "~playbook.edge-1"])
    assert e.value.key == "participant_instances.0.type" and e.value.line == 11
