"""The commented starting point that ``tracr experiment new NAME`` writes."""

from __future__ import annotations

import os
import re
from pathlib import Path

from app_api.fsutil import atomic_write, user_owned
from app_api.manifest.errors import ManifestError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_TEMPLATE = """\
# Experiment manifest for tracr. Run it with:  tracr experiment run {name}
# Try a change without editing this file:     tracr experiment run {name} --set run.warmup=5
# See the resolved manifest (defaults filled): tracr experiment show {name}
description: {name} - AlexNet split between two participants on this machine.

# The model both sides load. name: a registered model (`tracr model ls`) or
# torchvision:<name>. weights: null = seeded random weights (timing is the same,
# accuracy means nothing), or a local .pth file / torchvision weights name.
# depth: null = cut at every graph node; 1, 2, ... = only at top-level blocks.
model:
  name: alexnet
  weights: null
  depth: null
  mode: auto        # auto | graph (torch.fx) | hooks (forward-hook fallback)
  batch: 1

# Kinds of participant: a role (the service it runs) plus per-role settings.
participant_types:
  edge:
    role: edge
    settings: {{threads: 1}}   # torch threads on the device; null = torch's default
  cloud:
    role: cloud
    settings: {{threads: 1}}

# The participants themselves: which type runs on which device.
# `localhost` is built in; pair real devices with `tracr device pair`.
participant_instances:
  - {{name: edge-1, type: edge, device: localhost}}
  - {{name: cloud-1, type: cloud, device: localhost}}

# What each participant does, in order.
playbook:
  edge-1:
    - {{task: infer-dataset, params: {{}}}}
    - {{task: finish}}
  cloud-1:
    - {{task: wait}}

# Who decides the split point per inference: cyclic walks every valid split.
partitioner:
  name: cyclic
  params: {{repeats: 2}}

# Inputs: sample (shipped images), synthetic (random, params: size) or
# image-folder (params: path on the device, labels, limit, resize, crop).
dataset:
  name: sample
  params: {{limit: 2}}

# How crossing tensors are encoded on the wire.
transport:
  codec: zstd       # none | zstd | lz4 | lz4hc | blosclz | zlib
  level: 1          # 0-9
  filter: shuffle   # none | shuffle | bitshuffle

run:
  warmup: 2         # inferences run first and not measured
  repeats: 1
  seed: 0           # model init and synthetic data

# Link shaping in the emulated lab (tracr lab); ignored on localhost.
network:
  bandwidth: null   # e.g. "4MB/s", "100Mbit"
  delay_ms: null

# Partitioners to score against the measured sweep (in the run summary).
evaluate:
  partitioners: []
"""


def new_manifest_text(name: str) -> str:
    """A commented manifest for experiment ``name`` that validates as written."""
    return _TEMPLATE.format(name=name)


def write_new_manifest(name: str, folder: str | os.PathLike = "manifests",
                       force: bool = False) -> Path:
    """Write ``folder/NAME.yaml`` from the template and return its path.

    A name that is not a plain file stem, or an existing file without ``force``,
    raises :class:`ManifestError` (exit code 2).
    """
    if not _NAME.match(name) or name.endswith((".yaml", ".yml")):
        raise ManifestError(
            f"'{name}' is not a valid experiment name",
            hint="Use letters, digits, '-', '_' and '.', without the .yaml suffix.",
        )
    path = Path(folder) / f"{name}.yaml"
    if path.exists() and not force:
        raise ManifestError(f"{_rel(path)} already exists", hint="Pass --force to overwrite it.")
    created = not path.parent.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if created:
            user_owned(path.parent)
        # atomic, never through a planted symlink, and the user's own under sudo
        atomic_write(path, new_manifest_text(name))
    except OSError as exc:
        raise ManifestError(f"cannot write {_rel(path)}: {exc.strerror or exc}") from None
    return path


def _rel(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)
