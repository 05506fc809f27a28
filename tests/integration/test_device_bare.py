"""A device whose python has only torch and torchvision: everything else arrives at deploy.

The "bare device python" is a venv made with ``--without-pip`` from the python
the observer's venv came from; its site-packages holds one ``.pth`` naming a
directory of symlinks to exactly what ``pip install torch torchvision`` puts
there (the two and their dependency closure, read from the installed
metadata: numpy, pillow, sympy, networkx, jinja2...), and nothing else. It is
paired over the loopback sshd; ``tracr device prepare`` fills the observer's
wheel cache from the package index (through pip), and ``alexnet-sweep`` with
zstd runs with the edge on it. Nothing may be left on the device afterwards.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest

from app_api.devices.registry import DeviceRegistry
from tests.integration.test_device_run import assert_nothing_left, finish

pytestmark = [pytest.mark.integration, pytest.mark.ssh]

REPO = Path(__file__).resolve().parents[2]
SPLITS = [0, 5, 22]


def torch_closure() -> set[tuple[str, str]]:
    """(installed path, name) of every top-level file of torch, torchvision and what they
    require (markers evaluated here, no extras): what installing the two would bring."""
    from packaging.requirements import Requirement

    seen, todo, tops = set(), ["torch", "torchvision"], set()
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue
        for req in map(Requirement, dist.requires or []):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
        for f in dist.files or []:
            top = f.parts[0]
            if top not in ("..", "__pycache__") and not top.endswith(".pth"):
                tops.add((str(dist.locate_file(top)), top))
    return tops


def make_bare_python(dest: Path) -> str:
    """The bare device python in ``dest``; returns its interpreter's path."""
    base = Path(os.path.realpath(sys.base_prefix)) / "bin" / "python3"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(dest)], check=True, timeout=120)
    lib = dest / "torch-only"
    lib.mkdir()
    for src, name in sorted(torch_closure()):
        (lib / name).symlink_to(src)
    site = dest / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "torch-only.pth").write_text(f"{lib}\n")
    return str(dest / "bin" / "python")


@pytest.fixture(scope="module")
def bare(loopback_sshd, tmp_path_factory):
    """A registry (and config dir) with the bare python paired as device ``bare``."""
    root = tmp_path_factory.mktemp("bare")
    python = make_bare_python(root / "venv")
    reg = DeviceRegistry(root / "devices.yaml")
    reg.add(loopback_sshd.device("bare", python=python))
    reg.save()
    env = dict(os.environ, TRACR_DEVICES=str(reg.path), TRACR_CONFIG_DIR=str(root / "cfg"))
    return python, env, root


def tracr(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "app.py"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def run_sweep(env: dict, out: Path) -> subprocess.Popen:
    sets = ["participant_instances.edge-1.device=bare", "transport.codec=zstd",
            f"+partitioner.params.splits={json.dumps(SPLITS)}", "dataset.params.limit=1",
            "run.warmup=1", "partitioner.params.repeats=1"]  # fmt: skip
    cmd = [sys.executable, str(REPO / "app.py"), "experiment", "run", "alexnet-sweep",
           "--no-progress", "--out", str(out), *sum((["--set", s] for s in sets), [])]  # fmt: skip
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def test_bare_python_has_torch_and_nothing_else(bare):
    python, _, _ = bare
    code = ("import torch, torchvision, numpy, PIL.Image\n"
            "import importlib.util as u\n"
            "print([m for m in ('cryptography', 'blosc2', 'rpyc', 'yaml', 'experiment_design',"
            " 'cffi', 'msgpack') if u.find_spec(m)])")  # fmt: skip
    cp = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120,
                        cwd="/")  # fmt: skip
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == "[]"


def test_run_refused_before_deploy_while_the_cache_lacks_the_wheels(bare, loopback_sshd,
                                                                    tmp_path):
    _, env, _ = bare
    env = dict(env, TRACR_CONFIG_DIR=str(tmp_path / "empty-cfg"))  # an empty cache
    tracr(env, "device", "check", "bare")  # records what it lacks
    proc = run_sweep(env, tmp_path / "run")
    _, err = finish(proc, timeout=120)
    assert proc.returncode != 0
    assert "cryptography" in err and "tracr device prepare bare" in err, err
    assert_nothing_left(loopback_sshd)


def test_bare_device_runs_the_sweep_with_zstd_and_leaves_nothing(bare, loopback_sshd, tmp_path):
    python, env, _ = bare
    cp = tracr(env, "device", "check", "bare", "--json")
    report = json.loads(cp.stdout)["bare"]
    assert report["status"] == "ok"
    assert "cryptography" in report["deps"]["lacks"] and "blosc2" in report["deps"]["lacks"]
    cp = tracr(env, "device", "prepare", "bare", timeout=900)
    assert cp.returncode == 0, cp.stderr
    cp = tracr(env, "device", "check", "bare", "--json")
    deps = json.loads(cp.stdout)["bare"]["deps"]
    assert deps["uncached"] == [] and sorted(deps["cached"]) == sorted(deps["lacks"]), deps
    assert cp.returncode == 0, cp.stderr

    out = tmp_path / "run"
    proc = run_sweep(env, out)
    _, err = finish(proc, timeout=300)
    assert proc.returncode == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["inferences"] == len(SPLITS)
    from app_api.results import read_csv

    rows = read_csv(out / "inferences.csv")
    assert [int(r["split"]) for r in rows] == SPLITS and not [r for r in rows if r["error"]]
    assert all(r["transport"].startswith("zstd") for r in rows)
    envs = json.loads((out / "environment.json").read_text())
    assert envs["edge-1"]["device_name"] == "bare"
    assert str(loopback_sshd.port) in envs["edge-1"]["host_label"]
    assert_nothing_left(loopback_sshd)
    # the device's python is as bare as before: the wheels went with the temp dir
    assert not list(Path(python).parents[1].rglob("blosc2*"))
