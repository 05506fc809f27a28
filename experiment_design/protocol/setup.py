"""hello(), setup() and check_graph(): what a participant is, what it builds, and the
graph partners must agree on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from experiment_design.protocol.wire import Message


@dataclass
class Environment(Message):
    """hello(): what a participant reports about itself (see ``runtime/environment.py``)."""

    python: str = ""
    python_impl: str = ""
    torch: str = ""
    tracr: str = ""
    git_commit: str | None = None
    hostname: str = ""
    platform: str = ""
    device: str = ""
    accelerator: str | None = None
    cpu_model: str = ""
    cores: int | None = None
    threads: int | None = None
    allocator: dict = field(default_factory=dict)
    pid: int | None = None
    role: str = ""
    instance: str = ""
    extra: dict = field(default_factory=dict)


@dataclass
class SetupConfig(Message):
    """setup(): the model, dataset, transport, partitioner and secrets of one participant."""

    omit_none: ClassVar[bool] = True

    instance: str | None = None
    model: dict = field(default_factory=dict)
    seed: int = 0
    dataset: dict | None = None
    transport: dict | None = None
    partitioner: dict | None = None
    run: dict | None = None
    data_secret: str = ""
    threads: int | None = None
    data_bind: str | None = None
    data_port: int | None = None
    settings: dict | None = None
    device: str | None = None
    pipeline: dict | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class SetupInfo(Message):
    """setup()'s reply: the facts of the model as this participant built it."""

    omit_none: ClassVar[bool] = True

    mode: str | None = None
    n_layers: int = 0
    valid_splits: list[int] = field(default_factory=list)
    points: list[dict] = field(default_factory=list)
    profile: list[dict] = field(default_factory=list)
    inputs: int = 0
    threads: int | None = None
    device: str | None = None
    prepared: dict | None = None
    data_address: list | None = None  # roles with a data server (cloud)
    partitioner_needs: list[str] | None = None  # roles that own a partitioner (edge)
    #: the fingerprint of the graph as this participant's torch traced it, and its nodes
    #: (``split/fingerprint.py``): partners must agree on it to exchange tensors
    graph: str | None = None
    graph_nodes: list[str] | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class GraphPlan(Message):
    """check_graph(): the plan's graph (the reference participant's, with its torch), which
    a participant compares with its own before any tensor is exchanged."""

    reference: str
    torch: str
    digest: str
    nodes: list[str] = field(default_factory=list)
