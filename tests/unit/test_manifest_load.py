"""Loading manifests: search path, defaults, the shipped manifests and the template."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app_api.manifest import (
    Manifest,
    ManifestError,
    find_manifest,
    list_manifests,
    load_manifest,
    new_manifest_text,
)

REPO = Path(__file__).resolve().parents[2]
MINIMAL = """\
model: alexnet
participant_types:
  edge: {role: edge}
  cloud: {role: cloud}
participant_instances:
  - {name: edge-1, type: edge}
  - {name: cloud-1, type: cloud}
playbook:
  edge-1: [infer-dataset, finish]
  cloud-1: [wait]
"""


def write(tmp_path: Path, text: str, name: str = "exp") -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(text)
    return p


def test_minimal_manifest_gets_every_default(tmp_path):
    m = load_manifest(str(write(tmp_path, MINIMAL)))
    assert isinstance(m, Manifest)
    assert m.name == "exp"
    assert m.model == {
        "name": "alexnet",
        "weights": None,
        "depth": None,
        "mode": "auto",
        "batch": 1,
    }
    assert m.participant_types["edge"] == {
        "role": "edge",
        "model": None,
        "settings": {"threads": None},
    }
    assert m.participant_instances[0] == {"name": "edge-1", "type": "edge", "device": "localhost"}
    assert m.playbook["edge-1"] == [
        {"task": "infer-dataset", "params": {}},
        {"task": "finish", "params": {}},
    ]
    assert m.partitioner == {"name": "cyclic", "params": {}}
    assert m.dataset == {"name": "sample", "params": {}}
    assert m.transport == {"codec": "zstd", "level": 1, "filter": "shuffle", "encrypt": False,
                           "lossy": "none", "granularity": "tensor", "quality": 90}
    assert m.run == {"warmup": 2, "repeats": 1, "seed": 0, "timeout_s": None,
                     "liveness_timeout_s": 30, "startup_timeout_s": 600}
    assert m.network["bandwidth"] is None and m.network["bandwidths"] is None
    assert m.network["delay_ms"] is None
    assert m.evaluate == {"partitioners": [], "hindsight": None}
    assert m.description == ""


def test_manifest_is_read_only_and_sections_are_copies(tmp_path):
    m = load_manifest(str(write(tmp_path, MINIMAL)))
    m.run["warmup"] = 99
    assert m.run["warmup"] == 2
    with pytest.raises(AttributeError):
        m.name = "other"
    assert m.role_of("cloud-1") == "cloud"
    assert m.model_for("edge-1") == "alexnet"
    assert m.settings_of("edge-1") == {"threads": None}


def test_to_yaml_round_trips(tmp_path):
    m = load_manifest(str(write(tmp_path, MINIMAL)))
    again = load_manifest(str(write(tmp_path, m.to_yaml(), "again")))
    assert again.raw == m.raw


def test_extension_keys_are_kept(tmp_path):
    m = load_manifest(str(write(tmp_path, MINIMAL + "x-notes: {owner: me}\n")))
    assert m.raw["x-notes"] == {"owner": "me"}


@pytest.mark.parametrize("name", ["alexnet-sweep", "resnet18-sweep"])
def test_shipped_manifests_validate(name):
    m = load_manifest(name)
    assert m.path == find_manifest(name)
    assert m.description
    assert m.partitioner["name"] == "cyclic"
    assert m.dataset["name"] == "sample"
    assert {i["device"] for i in m.participant_instances} == {"localhost"}
    assert all(t["settings"]["threads"] == 1 for t in m.participant_types.values())


def test_every_repo_manifest_validates():
    """Manifests shipped in the repository (whoever wrote them) must load.

    Devices are pointed at localhost: lab and paired devices do not exist here.
    """
    for path in sorted((REPO / "manifests").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        to_local = [
            f"participant_instances.{i}.device=localhost"
            for i, inst in enumerate(raw.get("participant_instances") or [])
            if "device" in inst
        ]
        load_manifest(str(path), to_local)


def test_template_validates(tmp_path):
    text = new_manifest_text("my-exp")
    assert text.count("#") > 10  # commented for newcomers
    m = load_manifest(str(write(tmp_path, text, "my-exp")))
    assert m.name == "my-exp"
    assert "my-exp" in m.description


def test_search_path_order_and_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "manifests"
    local.mkdir()
    write(local, MINIMAL.replace("model: alexnet", "model: vgg16"), "alexnet-sweep")
    # ./manifests shadows the repository's manifest of the same name.
    assert find_manifest("alexnet-sweep") == local / "alexnet-sweep.yaml"
    assert load_manifest("alexnet-sweep").model["name"] == "vgg16"
    # A path works too, relative or absolute, with or without a directory.
    assert find_manifest("manifests/alexnet-sweep.yaml").resolve() == (local / "alexnet-sweep.yaml")
    assert (
        find_manifest(str(REPO / "manifests" / "resnet18-sweep.yaml")).name == "resnet18-sweep.yaml"
    )
    names = {n: p for n, p, _ in list_manifests()}
    assert names["alexnet-sweep"] == local / "alexnet-sweep.yaml"
    assert "resnet18-sweep" in names


def test_config_dir_manifests_are_found(tmp_path, monkeypatch):
    cfg = tmp_path / "cfg"
    (cfg / "manifests").mkdir(parents=True)
    write(cfg / "manifests", "description: from config\n" + MINIMAL, "cfg-exp")
    monkeypatch.setenv("TRACR_CONFIG_DIR", str(cfg))
    monkeypatch.chdir(tmp_path)
    assert load_manifest("cfg-exp").description == "from config"
    assert ("cfg-exp", cfg / "manifests" / "cfg-exp.yaml", "from config") in list_manifests()


def test_unknown_experiment_lists_the_known_ones():
    with pytest.raises(ManifestError) as e:
        find_manifest("alexnet-swep")
    assert "Unknown experiment 'alexnet-swep'" in e.value.message
    assert "Did you mean 'alexnet-sweep'?" in e.value.message
    assert "tracr experiment new" in e.value.hint
    assert e.value.exit_code == 2


def test_resolved_yaml_is_plain_yaml(tmp_path):
    m = load_manifest(str(write(tmp_path, MINIMAL)))
    assert yaml.safe_load(m.to_yaml())["transport"]["codec"] == "zstd"
