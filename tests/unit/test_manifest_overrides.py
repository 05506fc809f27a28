"""The override grammar: a.b=v changes, +a.b=v adds, ++a.b=v upserts, ~a.b removes."""

from __future__ import annotations

import pytest

from app_api.manifest import (
    ManifestError,
    Override,
    OverrideKind,
    apply_overrides,
    load_manifest,
    parse_overrides,
)

DATA = {
    "model": {"name": "alexnet", "depth": None},
    "participant_instances": [
        {"name": "edge-1", "type": "edge", "device": "localhost"},
        {"name": "cloud-1", "type": "cloud", "device": "localhost"},
    ],
    "run": {"warmup": 2},
}


def test_change_existing_values_parsed_as_yaml():
    out = apply_overrides(
        DATA,
        ["run.warmup=5", "model.depth=2", "model.name=torchvision:resnet18", "run.warmup=null"],
    )
    assert out["model"] == {"name": "torchvision:resnet18", "depth": 2}
    assert out["run"]["warmup"] is None
    assert DATA["run"]["warmup"] == 2  # the input is not modified
    out = apply_overrides(DATA, ["model.depth=[1, 2]", "model.name='a=b'"])
    assert out["model"] == {"name": "a=b", "depth": [1, 2]}


def test_list_items_by_index_and_by_name():
    out = apply_overrides(
        DATA, ["participant_instances.0.device=lab-1", "participant_instances.cloud-1.device=lab-2"]
    )
    assert [i["device"] for i in out["participant_instances"]] == ["lab-1", "lab-2"]
    out = apply_overrides(DATA, ["participant_instances.-1.type=edge"])
    assert out["participant_instances"][1]["type"] == "edge"


def test_typo_suggests_add_and_closest_key():
    with pytest.raises(ManifestError) as e:
        apply_overrides(DATA, ["run.warmpu=3"])
    assert "Could not override 'run.warmpu'. To add it use +run.warmpu=3" in e.value.message
    assert "did you mean 'run.warmup'?" in e.value.message
    with pytest.raises(ManifestError, match="Could not override 'nothing.here'"):
        apply_overrides(DATA, ["nothing.here=1"])


def test_add_and_upsert():
    out = apply_overrides(DATA, ["+run.repeats=3", "+network.bandwidth=4MB/s"])
    assert out["run"]["repeats"] == 3 and out["network"] == {"bandwidth": "4MB/s"}
    with pytest.raises(ManifestError, match="already exists. To change it use run.warmup=1"):
        apply_overrides(DATA, ["+run.warmup=1"])
    out = apply_overrides(DATA, ["++run.warmup=1", "++run.seed=7"])
    assert out["run"] == {"warmup": 1, "seed": 7}
    new = "{name: edge-2, type: edge, device: localhost}"
    out = apply_overrides(DATA, [f"+participant_instances.2={new}"])
    assert out["participant_instances"][2]["name"] == "edge-2"
    with pytest.raises(ManifestError, match="use index 2 to append"):
        apply_overrides(DATA, [f"+participant_instances.5={new}"])


def test_remove():
    out = apply_overrides(DATA, ["~model.depth", "~participant_instances.edge-1"])
    assert out["model"] == {"name": "alexnet"}
    assert [i["name"] for i in out["participant_instances"]] == ["cloud-1"]
    out = apply_overrides(DATA, ["~run.warmup=2"])
    assert out["run"] == {}
    with pytest.raises(ManifestError, match="its value is 2, not 3"):
        apply_overrides(DATA, ["~run.warmup=3"])
    with pytest.raises(ManifestError, match="Could not remove 'run.nope'"):
        apply_overrides(DATA, ["~run.nope"])


@pytest.mark.parametrize(
    "bad,text",
    [
        ("run.warmup", "has no '=value'"),
        ("=3", "empty key"),
        ("run..warmup=3", "empty key"),
        ("run.warmup.x=3", "is a value"),
        ("participant_instances.edge-9.device=x", "neither an index nor the name"),
        ("participant_instances.7.device=x", "has only 2 items"),
        ("run.warmup=[1", "cannot parse the value"),
    ],
)
def test_malformed_overrides(bad, text):
    with pytest.raises(ManifestError, match=text.replace(".", r"\.").replace("[", r"\[")):
        apply_overrides(DATA, [bad])


def test_overrides_apply_before_validation_and_see_defaults():
    m = load_manifest(
        "alexnet-sweep",
        [
            "network.delay_ms=20",  # the file omits delay_ms: defaults count as existing keys
            "network.bandwidth=4MB/s",
            "participant_instances.edge-1.device=localhost",
            "transport.codec=lz4",
            "+dataset.params.resize=300",
        ],
    )
    assert m.network["bandwidth"] == "4MB/s" and m.network["delay_ms"] == 20
    assert m.transport["codec"] == "lz4" and m.dataset["params"]["resize"] == 300
    assert m.overrides[0] == "network.delay_ms=20"


def test_override_errors_name_the_file():
    with pytest.raises(ManifestError) as e:
        load_manifest("alexnet-sweep", ["run.warmpu=3"])
    assert e.value.message.startswith(e.value.file)
    assert e.value.file.endswith("alexnet-sweep.yaml")


@pytest.mark.parametrize(
    "text, kind, key, value, has_value",
    [
        ("a.b=3", OverrideKind.CHANGE, "a.b", 3, True),
        ("+a.b=[1, 2]", OverrideKind.ADD, "a.b", [1, 2], True),
        ("++a.b=x", OverrideKind.FORCE_ADD, "a.b", "x", True),
        ("~a.b", OverrideKind.REMOVE, "a.b", None, False),
        ("~a.b=null", OverrideKind.REMOVE, "a.b", None, True),
        ("model.name='a=b'", OverrideKind.CHANGE, "model.name", "a=b", True),
    ],
)
def test_overrides_are_parsed_once_into_objects(text, kind, key, value, has_value):
    o = Override.parse(text)
    assert (o.kind, o.key, o.value, o.has_value) == (kind, key, value, has_value)
    assert str(o) == text and parse_overrides([text, o]) == (o, o)


def test_a_loaded_manifest_keeps_its_override_objects():
    texts = ["run.warmup=2", "participant_instances.edge-1.device=localhost"]
    m = load_manifest("alexnet-sweep", parse_overrides(texts))
    assert m.overrides == texts
    assert [o.key for o in m.parsed_overrides] == ["run.warmup", "participant_instances.edge-1.device"]
