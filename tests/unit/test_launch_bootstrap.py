"""The deploy bootstrap run locally (no SSH): stdin framing, the temp venv, cleanup on failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from app_api.launch.bundle import bootstrap_command, build_bundle, bundle_header


def run_bootstrap(tmp_path, stdin: bytes, config: dict | None = None, then: str = ""):
    cmd = bootstrap_command(sys.executable, config) + then
    env = dict(os.environ, TMPDIR=str(tmp_path))  # the bootstrap's temp dir lands here
    return subprocess.run(["sh", "-c", cmd], input=stdin, capture_output=True, env=env, timeout=60)


def boot_line(cp) -> dict:
    line = next(ln for ln in cp.stdout.decode().splitlines() if ln.startswith("TRACR-BOOT "))
    return json.loads(line.split(" ", 1)[1])


def test_bootstrap_reads_exactly_the_bundle_and_leaves_the_rest_on_stdin(tmp_path):
    bundle = build_bundle()
    # `cat` after the bootstrap sees what the participant would read: the secret line
    cp = run_bootstrap(tmp_path, bundle_header(bundle) + bundle + b"c0ffee\n", {"need": ["torch"]},
                       then="; cat")  # fmt: skip
    assert cp.returncode == 0, cp.stderr
    info = boot_line(cp)
    assert cp.stdout.decode().splitlines()[-1] == "c0ffee"
    d = info["dir"]
    assert os.path.dirname(d) == str(tmp_path) and os.path.basename(d).startswith("tracr-")
    assert info["found"]["torch"] and info["missing"] == []
    assert os.path.exists(os.path.join(d, "experiment_design", "participant.py"))
    # the venv's python sees the shipped rpyc first and the device's own torch
    code = (
        "import importlib.util as u; print(u.find_spec('rpyc').origin, u.find_spec('torch').origin)"
    )
    out = subprocess.run([info["python"], "-c", code], capture_output=True, text=True, check=True)
    rpyc_file, torch_file = out.stdout.split()
    assert rpyc_file.startswith(d) and not torch_file.startswith(d)


def test_missing_required_module_stops_before_starting_and_removes_the_dir(tmp_path):
    bundle = build_bundle()
    cp = run_bootstrap(tmp_path, bundle_header(bundle) + bundle,
                       {"need": ["torch", "blosc2_not_here"], "args": ["--role", "cloud"]})  # fmt: skip
    assert cp.returncode == 4
    info = boot_line(cp)
    assert info["missing"] == ["blosc2_not_here"]
    assert os.listdir(tmp_path) == []


def test_cut_short_bundle_fails_cleanly(tmp_path):
    bundle = build_bundle()
    cp = run_bootstrap(tmp_path, bundle_header(bundle) + bundle[: len(bundle) // 2])
    assert cp.returncode == 3
    assert "TRACR-BOOT-FAILED EOFError" in cp.stdout.decode()
    assert os.listdir(tmp_path) == []
