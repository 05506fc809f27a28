"""hello(), setup() and check_graph(): what a participant is, what it builds, and the
graph partners must agree on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, TypedDict

from experiment_design.protocol.wire import LIVENESS_TIMEOUT_S, Message


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
    #: the memory allocator and its settings (``runtime/allocator.py``; open: what each
    #: allocator reports differs)
    allocator: dict = field(default_factory=dict)
    pid: int | None = None
    role: str = ""
    instance: str = ""
    extra: dict = field(default_factory=dict)


@dataclass
class ModelConfig(Message):
    """The manifest's ``model``: a registered model (or ``torchvision:<name>``), its weights
    (None: random), how many of its blocks, how it is split (``auto``, ``graph`` or
    ``sequential``) and the inputs one inference carries (``batch``)."""

    name: str = ""
    weights: str | None = None
    depth: int | None = None
    mode: str = "auto"
    batch: int = 1


@dataclass
class DatasetConfig(Message):
    """The manifest's ``dataset``: a registered dataset and its parameters."""

    name: str
    #: the dataset's own parameters, declared by the dataset class (open-ended: a user's
    #: dataset names its own)
    params: dict = field(default_factory=dict)


@dataclass
class PartitionerConfig(Message):
    """The manifest's ``partitioner``: a registered partitioner and its parameters."""

    name: str = "cyclic"
    #: the partitioner's own parameters, declared by the partitioner class (open-ended: a
    #: user's partitioner names its own)
    params: dict = field(default_factory=dict)


@dataclass
class TransportConfig(Message):
    """The manifest's ``transport``: how the sender encodes crossing tensors (see
    ``transport.CodecConfig``, which the participant builds from it and which checks it)."""

    omit_none: ClassVar[bool] = True

    codec: str = "zstd"
    level: int = 1
    filter: str = "shuffle"
    encrypt: bool = False
    lossy: str = "none"
    granularity: str = "tensor"
    quality: int = 90
    nthreads: int | None = None  # blosc2's threads per call (not a manifest key: 1 unless set)


@dataclass
class RunConfig(Message):
    """The manifest's ``run``: inferences discarded first, repeats per split, the seed, and
    the run's time limits (seconds; ``timeout_s`` None: none). The defaults are the
    schema's (``app_api/manifest/schema.py``)."""

    warmup: int = 2
    repeats: int = 1
    seed: int = 0
    timeout_s: float | None = None
    liveness_timeout_s: float = LIVENESS_TIMEOUT_S
    startup_timeout_s: float = 600.0


@dataclass
class PipelineConfig(Message):
    """The manifest's ``pipeline``: the chain of stages (instances in stage order; None:
    the edge and its clouds), the modes measured, inferences per configuration and mode,
    how many are in flight at once in throughput mode, each stage's queue depth, and
    whether each participant also runs the whole model alone (the baselines)."""

    chain: list[str] | None = None
    modes: list[str] = field(default_factory=lambda: ["throughput", "latency"])
    count: int = 32
    in_flight: int = 4
    queue: int = 2
    baselines: bool = True


@dataclass
class SetupConfig(Message):
    """setup(): the model, dataset, transport, partitioner and secrets of one participant.

    ``settings`` stays a plain mapping: it is open (a participant type's own keys, the
    energy collectors' parameters).
    """

    omit_none: ClassVar[bool] = True

    instance: str | None = None
    model: ModelConfig = field(default_factory=ModelConfig)
    seed: int = 0
    dataset: DatasetConfig | None = None
    transport: TransportConfig | None = None
    partitioner: PartitionerConfig | None = None
    run: RunConfig | None = None
    data_secret: str = ""
    threads: int | None = None
    data_bind: str | None = None
    data_port: int | None = None
    settings: dict | None = None
    device: str | None = None
    pipeline: PipelineConfig | None = None
    extra: dict = field(default_factory=dict)


class Prepared(TypedDict):
    """What a participant built at set-up before anything is measured: the side of every
    cut it computes (``prefix``, ``suffix`` or None), how many cuts, and how long it took."""

    side: str | None
    splits: int
    ms: float


@dataclass
class SetupInfo(Message):
    """setup()'s reply: the facts of the model as this participant built it."""

    omit_none: ClassVar[bool] = True

    mode: str | None = None
    n_layers: int = 0
    valid_splits: list[int] = field(default_factory=list)
    #: the split points and the per-layer rows (``SplitModel.points`` and ``.profile()``)
    #: as mappings: partitioners, the users' included, read them by key
    points: list[dict] = field(default_factory=list)
    profile: list[dict] = field(default_factory=list)
    inputs: int = 0
    threads: int | None = None
    device: str | None = None
    prepared: Prepared | None = None
    data_address: list | None = None  # [host, port]: roles with a data server (cloud)
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
