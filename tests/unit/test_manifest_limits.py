"""Any file at all as a manifest, any --set value: one located ManifestError (exit 2), never a
traceback (UnicodeDecodeError, RecursionError) and never an unbounded alias expansion."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app_api.manifest import ManifestError, load_manifest, parse_overrides
from tests.unit.test_manifest_errors import GOOD

REPO = Path(__file__).resolve().parents[2]

# 5 levels of 9 aliases: ~400 bytes that expand to 9**5 scalars (x- keys are never checked,
# so without a bound the document loads, and every walk over it is exponential)
LAUGHS = GOOD + "".join(
    f"x-{c}: &{c} [{', '.join([f'*{p}'] * 9 if p else ['lol'] * 9)}]\n"
    for p, c in zip(["", "a", "b", "c", "d"], "abcde", strict=True)
)


def load_error(tmp_path: Path, data: bytes, overrides=()) -> ManifestError:
    p = tmp_path / "m.yaml"
    p.write_bytes(data)
    with pytest.raises(ManifestError) as e:
        load_manifest(str(p), overrides)
    assert e.value.exit_code == 2 and e.value.file.endswith("m.yaml")
    return e.value


def test_not_utf8_names_the_byte_and_line(tmp_path):
    err = load_error(tmp_path, b"description: t\nmodel: \xff\xfe\n")
    assert err.line == 2 and "UTF-8" in err.problem and "0xff" in err.problem


def test_binary_file(tmp_path):
    err = load_error(tmp_path, bytes(range(256)) * 4)
    assert "UTF-8" in err.problem or "invalid YAML" in err.problem


def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path):
    err = load_error(tmp_path, b"description: " + b"[" * 5000 + b"]" * 5000 + b"\n")
    assert "nested more than" in err.problem and err.line == 1


def test_deep_mapping_nesting(tmp_path):
    text = "".join("  " * i + f"k{i}:\n" for i in range(200))
    err = load_error(tmp_path, (GOOD + "x-deep:\n" + "\n".join(
        "  " + line for line in text.splitlines()) + "\n").encode())
    assert "nested more than" in err.problem


def test_self_referencing_alias(tmp_path):
    err = load_error(tmp_path, (GOOD + "x-loop: &loop [*loop]\n").encode())
    assert "refers to its own anchor" in err.problem and err.line == GOOD.count("\n") + 1


def test_self_referencing_mapping_alias(tmp_path):
    err = load_error(tmp_path, (GOOD + "x-loop: &m {a: *m}\n").encode())
    assert "refers to its own anchor" in err.problem


def test_alias_expansion_is_bounded(tmp_path):
    assert len(LAUGHS) - len(GOOD) < 400
    err = load_error(tmp_path, LAUGHS.encode())
    assert "aliases" in err.problem


def test_a_few_aliases_still_work(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text(GOOD.replace("    settings: {threads: 1}", "    settings: &s {threads: 1}")
                 + "x-shared: *s\n")
    assert load_manifest(str(p)).raw["x-shared"] == {"threads": 1}


def test_huge_file(tmp_path):
    err = load_error(tmp_path, b"# " + b"x" * (2 << 20) + b"\n" + GOOD.encode())
    assert "too big" in err.problem


def test_complex_key(tmp_path):
    err = load_error(tmp_path, ("? [a, b]\n: 1\n" + GOOD).encode())
    assert "keys must be strings" in err.problem


@pytest.mark.parametrize("value", [
    "[" * 5000 + "]" * 5000,
    "&a [*a]",
    "[&a [x, x, x, x, x, x, x, x, x], &b [*a, *a, *a, *a, *a, *a, *a, *a, *a], "
    "&c [*b, *b, *b, *b, *b, *b, *b, *b, *b], [*c, *c, *c, *c, *c, *c, *c, *c, *c]]",
], ids=["deep", "self-alias", "laughs"])
def test_override_values_are_bounded(value):
    with pytest.raises(ManifestError) as e:
        parse_overrides([f"+x-v={value}"])
    assert e.value.exit_code == 2 and "x-v" in e.value.message


def test_override_index_with_too_many_digits(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text(GOOD)
    with pytest.raises(ManifestError) as e:
        load_manifest(str(p), ["participant_instances." + "9" * 5000 + ".device=x"])
    assert e.value.exit_code == 2


def test_cli_prints_one_line_and_exits_2(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_bytes(b"description: " + b"[" * 5000 + b"]" * 5000 + b"\n")
    r = subprocess.run([sys.executable, str(REPO / "app.py"), "experiment", "validate", str(p)],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.startswith("error: ")
    assert "m.yaml:1" in r.stderr


def test_errors_stay_on_one_line_without_terminal_escapes(tmp_path):
    err = load_error(tmp_path, (GOOD + '"evil\\n\\x1b[31mkey": 1\n').encode())
    assert err.message.isprintable() and "\\n" in err.message and "\\x1b" in err.message
    with pytest.raises(ManifestError) as e:
        parse_overrides(["a\nb\x1b[2J"])
    assert e.value.message.isprintable()
