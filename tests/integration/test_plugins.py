"""A user's own package, outside tracr's source tree, adds a model and a partitioner that
``tracr experiment run`` uses: once through a manifest's ``plugins``, once through an
installed distribution's ``tracr.plugins`` entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

PARTS = '''
from experiment_design.models import register_model
from experiment_design.partitioners import Partitioner, register_partitioner


@register_model("user-tiny", input_shape=(3, 32, 32))
def user_tiny(**kwargs):
    import torch.nn as nn

    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 10))


@register_partitioner("user-last")
class UserLast(Partitioner):
    """Always the last valid split (everything on the edge)."""

    def setup(self, ctx):
        super().setup(ctx)
        self.k = max(ctx.valid_splits)

    def next_split(self):
        return self.k

    def decision(self):
        return {"chosen": self.k, "why": "the user's own"}
'''

MANIFEST = '''
description: a user's model and partitioner from their own package
{plugins}
model: {{name: user-tiny}}
participant_types:
  edge: {{role: edge, settings: {{threads: 1}}}}
  cloud: {{role: cloud, settings: {{threads: 1}}}}
participant_instances:
  - {{name: edge-1, type: edge, device: localhost}}
  - {{name: cloud-1, type: cloud, device: localhost}}
playbook:
  edge-1: [{{task: infer-dataset, params: {{count: 4}}}}, {{task: finish}}]
  cloud-1: [{{task: wait}}]
partitioner: {{name: user-last}}
dataset: {{name: synthetic, params: {{size: 2}}}}
run: {{warmup: 1}}
'''


def _user_package(root: Path) -> Path:
    pkg = root / "src" / "tracr_userpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "parts.py").write_text(textwrap.dedent(PARTS))
    return root / "src"


def _run(cwd: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "app.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _env(tmp_path: Path, pythonpath: list[Path]) -> dict:
    env = dict(os.environ, TRACR_RESULTS_DIR=str(tmp_path / "results"))
    env.pop("TRACR_PLUGINS", None)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    return env


def _check(result: Path) -> None:
    summary = json.loads((result / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["failed"] == 0
    # every inference at the user's partitioner's split: the whole model on the edge
    assert [s["split"] for s in summary["splits"]] == [summary["splits"][0]["split"]]
    assert summary["splits"][0]["count"] == 4


@pytest.mark.slow
def test_a_manifest_names_a_plugin_from_a_package_outside_the_tree(tmp_path):
    src = _user_package(tmp_path)
    work = tmp_path / "work"
    (work / "manifests").mkdir(parents=True)
    (work / "manifests" / "mine.yaml").write_text(
        MANIFEST.format(plugins="plugins: [tracr_userpkg.parts]"))
    env = _env(tmp_path, [src])
    proc = _run(work, env, "experiment", "run", "mine", "--no-progress", "--out",
                str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    _check(tmp_path / "out")
    # without the plugin the same names are unknown, with the usual did-you-mean error
    (work / "manifests" / "bare.yaml").write_text(MANIFEST.format(plugins=""))
    proc = _run(work, env, "experiment", "validate", "bare")
    assert proc.returncode == 2 and "Unknown model 'user-tiny'" in proc.stderr


@pytest.mark.slow
def test_an_installed_entry_point_registers_without_the_manifest_saying_so(tmp_path):
    src = _user_package(tmp_path)
    # an installed distribution's metadata: what pip writes for
    # [project.entry-points."tracr.plugins"] parts = "tracr_userpkg.parts"
    dist = src / "tracr_userpkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tracr-userpkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[tracr.plugins]\nparts = tracr_userpkg.parts\n")
    work = tmp_path / "work"
    (work / "manifests").mkdir(parents=True)
    (work / "manifests" / "mine.yaml").write_text(MANIFEST.format(plugins=""))
    env = _env(tmp_path, [src])
    proc = _run(work, env, "model", "ls", "user-*")
    assert proc.returncode == 0 and "user-tiny" in proc.stdout, proc.stderr[-2000:]
    proc = _run(work, env, "experiment", "run", "mine", "--no-progress", "--out",
                str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    _check(tmp_path / "out")


@pytest.mark.ssh
def test_a_device_is_sent_the_plugin_package_and_keeps_nothing(loopback_sshd, tmp_path):
    """Over SSH the device cannot import the user's package (PYTHONPATH stays here): the
    bundle carries it, into the temp dir that goes with the run."""
    from app_api.devices.registry import DeviceRegistry

    src = _user_package(tmp_path)
    reg = DeviceRegistry(tmp_path / "devices.yaml")
    reg.add(loopback_sshd.device("loop"))
    reg.save()
    work = tmp_path / "work"
    (work / "manifests").mkdir(parents=True)
    (work / "manifests" / "mine.yaml").write_text(
        MANIFEST.format(plugins="plugins: [tracr_userpkg.parts]").replace(
            "device: localhost", "device: loop"))
    env = dict(_env(tmp_path, [src]), TRACR_DEVICES=str(reg.path))
    proc = _run(work, env, "experiment", "run", "mine", "--no-progress", "--out",
                str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    _check(tmp_path / "out")
    assert not [p for p in Path(loopback_sshd.tmp).iterdir() if p.name.startswith("tracr")]


def test_the_bundle_carries_the_plugin_package(tmp_path, monkeypatch):
    import io
    import tarfile

    from app_api.launch.bundle import build_bundle

    src = _user_package(tmp_path)
    monkeypatch.syspath_prepend(str(src))
    monkeypatch.setenv("TRACR_PLUGINS", "tracr_userpkg.parts")
    with tarfile.open(fileobj=io.BytesIO(build_bundle()), mode="r:gz") as tf:
        names = tf.getnames()
    assert "deps/tracr_userpkg/parts.py" in names and "deps/tracr_userpkg/__init__.py" in names
    monkeypatch.delenv("TRACR_PLUGINS")
    with tarfile.open(fileobj=io.BytesIO(build_bundle()), mode="r:gz") as tf:
        assert not [n for n in tf.getnames() if n.startswith("deps/tracr_userpkg")]
