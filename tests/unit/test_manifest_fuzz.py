"""Property-based: whatever the manifest file and the ``--set`` overrides, the loader answers
with a Manifest or a TracrError of exit code 2, never another exception (a traceback).

Over 1000 generated cases per run: raw bytes and YAML-ish text, documents built from the
schema's own keys with values of every type, and overrides in the full grammar.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app_api.manifest import load_manifest
from app_api.manifest.schema import SCHEMA, Field
from experiment_design.errors import TracrError
from tests.unit.test_manifest_errors import GOOD


def fuzz(n: int) -> settings:
    """``n`` examples, no deadline (the first load imports the registries), no example file."""
    return settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck),
                    database=None)


def schema_keys(f: Field = SCHEMA) -> set[str]:
    out = set()
    for k, sub in (f.keys or {}).items():
        out |= {k} | schema_keys(sub)
    for sub in (f.values, f.items):
        if sub is not None:
            out |= schema_keys(sub)
    return out


KEYS = sorted(schema_keys()) + ["edge", "cloud", "edge-1", "cloud-1", "x-ext", "limit"]
NAMES = ["alexnet", "cyclic", "fixed", "sample", "edge", "cloud", "wait", "infer-dataset",
         "finish", "localhost", "zstd", "lz4", "shuffle", "4MB/s", "-1", "edge-1", "cloud-1"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-3, 30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from(NAMES), st.sampled_from(KEYS),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=8)), inner, max_size=4),
    ),
    max_leaves=12,
)
BASE = yaml.safe_load(GOOD)


def paths(data, prefix=()):
    """Every key path of ``data`` (mappings and lists)."""
    out = [prefix]
    items = data.items() if isinstance(data, dict) else enumerate(data) \
        if isinstance(data, list) else []  # fmt: skip
    for k, v in items:
        out += paths(v, prefix + (k,))
    return out


@st.composite
def mutated_documents(draw) -> str:
    """GOOD with a few keys changed to any value, removed, or added from the schema's keys."""
    import copy

    data = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(paths(data)))
        parent, key = data, None
        for seg in path:
            parent, key = (parent, seg) if key is None else (parent[key], seg)
        action = draw(st.sampled_from(["set", "del", "add"]))
        if not path:
            if action == "set":
                data = draw(values)
            continue
        if action == "set":
            parent[key] = draw(values)
        elif action == "del":
            del parent[key]
        else:
            target = parent[key]
            if isinstance(target, dict):
                target[draw(st.sampled_from(KEYS))] = draw(values)
            elif isinstance(target, list):
                target.append(draw(values))
        if not isinstance(data, (dict, list)):
            break
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    if draw(st.integers(0, 3)) == 0:  # and some damage to the text itself
        i = draw(st.integers(0, len(text)))
        text = text[:i] + draw(st.one_of(st.sampled_from(HOSTILE), st.text(
            alphabet=":-[]{}&*!|>'\"#%@` \n\t?,", max_size=6))) + text[i:]
    return text


#: fragments that broke the loader once (or could): aliases, tags, complex keys, nesting
HOSTILE = ["&a [*a]", "*a", "&a x", "? [k]\n: v\n", "? {k: v}\n: v\n", "[" * 2000, "{a: &b [*b]}",
           "!!python/object/apply:os.system [id]", "!!binary AAAA", "2024-01-01", "<<: *a",
           "!!set {a, b}", "1e999", "0x_", "\ufeff", "\x00", "%YAML 1.1\n---\n", "--- a\n--- b\n"]


yaml_text = st.lists(st.sampled_from(list(":-[]{}&*!|>'\"#%@` \n\t?,ab01xy") + KEYS),
                     max_size=30).map("".join)
raw_files = st.one_of(st.binary(max_size=200), yaml_text.map(str.encode),
                      st.text(max_size=100).map(lambda s: s.encode("utf-8", "surrogatepass")))


KEY_PATHS = [".".join(map(str, p)) for p in paths(BASE) if p]


@st.composite
def override(draw) -> str:
    """One ``--set`` text: mostly well formed (an existing key path, a known prefix) so that
    most reach the schema, some anything at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=30))
    prefix = draw(st.sampled_from(["", "", "+", "++", "~"]))
    if draw(st.integers(0, 3)):
        key = draw(st.sampled_from(KEY_PATHS))
        if draw(st.booleans()):
            key += "." + draw(st.one_of(st.sampled_from(KEYS), st.sampled_from(["0", "-1", "99"])))
    else:
        key = ".".join(draw(st.lists(st.one_of(st.sampled_from(KEYS), st.text(max_size=5)),
                                     max_size=4)))
    if draw(st.integers(0, 3)):
        value = yaml.safe_dump(draw(values), default_flow_style=True, width=1 << 20)
        value = value.strip().removesuffix("...").strip().replace("\n", " ")
    else:
        value = draw(st.one_of(yaml_text, st.sampled_from(HOSTILE)))
    return prefix + key + ("" if prefix == "~" and draw(st.booleans()) else "=") + value


def overrides() -> st.SearchStrategy[list[str]]:
    """Zero to three overrides."""
    return st.lists(override(), max_size=3)


@pytest.fixture(scope="module", autouse=True)
def private_config():
    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACR_CONFIG_DIR", d)
        mp.setenv("TRACR_DEVICES", os.path.join(d, "devices.yaml"))
        yield Path(d)


def check(tmp: Path, data: bytes, sets: list[str]) -> None:
    p = tmp / "fuzz.yaml"
    p.write_bytes(data)
    try:
        load_manifest(str(p), sets)
    except TracrError as exc:
        assert exc.exit_code == 2, exc
        assert exc.message.strip(), "an error says what is wrong"
        assert exc.message.isprintable(), "one line, no terminal escapes"
        assert exc.hint is None or exc.hint.isprintable()


@fuzz(450)
@given(doc=mutated_documents(), sets=st.one_of(st.just([]), overrides()))
def test_documents_built_from_the_schema(private_config, doc, sets):
    check(private_config, doc.encode(), sets)


@fuzz(300)
@given(data=raw_files)
def test_any_bytes(private_config, data):
    check(private_config, data, [])


@fuzz(300)
@given(sets=overrides())
def test_any_overrides_on_a_good_manifest(private_config, sets):
    check(private_config, GOOD.encode(), sets)
