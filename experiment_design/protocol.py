"""The control protocol between the observer and its participants, torch-free.

Both sides import this module; nothing about the protocol is written anywhere
else. A participant process announces itself with one line on stdout::

    TRACR-READY {"port": 40123, "pid": 4242}

Liveness flows over the process's stdio both ways, in every phase (start-up
included): the participant prints :data:`ALIVE_LINE` every :data:`HEARTBEAT_S`
seconds from the moment it starts until it exits, and the observer writes the
same line to the participant's stdin as often; each side declares the other
lost when nothing arrives for its liveness timeout. It is then driven over rpyc (only ``exposed_`` members, no pickle). Every
control call takes at most one argument and answers one JSON document::

    call                   argument (JSON)   reply (JSON)
    hello()                -                 Environment
    setup(c)               SetupConfig       SetupInfo
    check_graph(g)         GraphPlan         "ok" (or an error naming the first node that differs)
    data_address()         -                 DataAddress or null
    admit_partners(a)      Admission         {...} (the role's own report)
    connect_partners(w)    Wiring            {...} (the role's own report)
    profile_layers(p)      ProfileParams     {...} (profiling.profile_split_model)
    probe_link(p)          LinkProbe         {...} or null
    warmup(w)              Warmup            WarmupDone
    prepare_partitioner(m) Measurements      PartitionerPlan or null
    start_task(t)          TaskStart         TaskStarted
    poll(p)                PollRequest       PollReply
    finish() / cancel() / heartbeat()        "ok"
    shutdown()                               "bye"

JSON strings stay the wire format because rpyc passes lists and dicts by
reference (every access a round trip) and pickle is off. The inference and
layer records that ``poll`` carries have their columns defined here once
(:data:`INFER_COLUMNS`, :data:`LAYER_COLUMNS`, :data:`METRIC_COLUMNS`); the results
store writes them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict, TypeVar

from experiment_design.errors import TracrError

#: ``python -m <PARTICIPANT_MODULE> --role NAME ...`` starts a participant process.
PARTICIPANT_MODULE = "experiment_design.participant"
READY_PREFIX = "TRACR-READY "
#: The heartbeat line, written both ways over the participant's stdio (not rpyc: a call in
#: progress, or a partner profiling for minutes, must not starve it).
ALIVE_LINE = "TRACR-ALIVE"
#: Seconds between two heartbeats; liveness timeouts are several of these.
HEARTBEAT_S = 2.0
#: A participant (or observer) silent this long is lost, unless the manifest says otherwise
#: (``run.liveness_timeout_s``).
LIVENESS_TIMEOUT_S = 30.0
#: The reply of finish(), cancel() and heartbeat(); shutdown() answers :data:`BYE`.
ACK = "ok"
BYE = "bye"

M = TypeVar("M", bound="Message")


class ProtocolError(TracrError):
    """A control message that does not decode into the type its call expects."""


@dataclass(frozen=True)
class Ready:
    """What a participant process announces once its control server listens."""

    port: int
    pid: int

    def line(self) -> str:
        """The stdout line, without its newline."""
        return READY_PREFIX + json.dumps({"port": self.port, "pid": self.pid})

    @classmethod
    def parse(cls, line: str) -> Ready | None:
        """The announcement in ``line``, or None when the line is something else."""
        line = line.strip()
        if not line.startswith(READY_PREFIX):
            return None
        data = json.loads(line[len(READY_PREFIX):])
        return cls(port=int(data["port"]), pid=int(data["pid"]))


class Message:
    """Base of the control messages: dataclasses that travel as JSON objects.

    ``omit_none`` leaves unset (None) fields out of the JSON, so an optional
    field reads the same to the other side whether it was sent empty or not at
    all. A message with an ``extra`` field is open: keys it does not name are
    kept there (a user's role may add its own) and written back flat; a closed
    message refuses unknown keys.
    """

    omit_none: ClassVar[bool] = False

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "extra":
                out.update(value)
            elif not (value is None and self.omit_none):
                out[f.name] = value
        return out

    def to_json(self) -> str:
        """The wire form."""
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls: type[M], data: Any) -> M:
        """Inverse of :meth:`to_dict`; a missing field takes its default."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ProtocolError(f"{cls.__name__}: expected a JSON object, got {data!r}")
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        known = {k: v for k, v in data.items() if k in names and k != "extra"}
        unknown = {k: v for k, v in data.items() if k not in names or k == "extra"}
        if unknown:
            if "extra" not in names:
                raise ProtocolError(f"{cls.__name__}: unexpected field(s) {sorted(unknown)}")
            known["extra"] = unknown
        try:
            return cls(**known)
        except TypeError as exc:  # a required field is missing
            raise ProtocolError(f"{cls.__name__}: {exc}") from None

    @classmethod
    def from_json(cls: type[M], text: str | None) -> M:
        """Decode the wire form (an empty string or ``null`` gives the defaults)."""
        try:
            data = json.loads(text) if text else None
        except ValueError as exc:
            raise ProtocolError(f"{cls.__name__}: not JSON: {exc}") from None
        return cls.from_dict(data)


# ----- records carried by poll() ------------------------------------------------------------
class InferenceRecord(TypedDict, total=False):
    """One inference, one row of ``inferences.csv``; the columns, in file order.

    A failed inference keeps only what was known before it failed (no zeros):
    its ``error`` says why, and the timing columns are absent.
    """

    inference: int
    item: str
    label: Any
    split: int
    layer: str
    edge_ms: float
    encode_ms: float
    transfer_ms: float
    decode_ms: float
    cloud_ms: float
    e2e_ms: float
    edge_cpu_ms: float
    cloud_cpu_ms: float | None
    bytes_raw: int
    bytes_encoded: int
    n_crossing: int
    top1: int | str
    output_sum: float
    # the transport the head sent with, and the output against the unsplit model's on the
    # same input (computed once at the head's set-up): see EdgeRole.rows_of
    transport: str
    top1_agree: int
    cosine: float
    max_abs_diff: float
    correct: int | str  # top1 == label; only with real weights and class-index labels
    weights: str
    instance: str  # set by the observer
    partner: str
    host: str  # set by the observer
    # wall-clock start (Unix seconds, the head's clock): matches an inference to the link's
    # timeline (the lab's hosts share the observer's clock)
    t_unix: float
    error: str


class LayerRecord(TypedDict, total=False):
    """One layer of one inference on one side, one row of ``layers.csv``."""

    inference: int
    instance: str  # the participant that ran the layer (else set by the observer)
    side: str
    index: int
    name: str
    type: str
    ms: float


class MetricSample(TypedDict, total=False):
    """One sample of a participant's metrics sampler (``runtime/sampler.py``), one row of
    ``metrics.csv``; the columns, in file order. Energy readings follow, one column per
    supported collector: ``<name>_j`` (a counter: joules since the sampler started) or
    ``<name>_w`` (power: watts). A figure the participant could not read is absent."""

    instance: str  # set by the observer
    t_unix: float
    rss_kb: int
    hwm_kb: int  # the peak since the previous sample where the mark is reset, else so far
    cpu_s: float  # the process's user + system CPU seconds
    machine_busy: float  # the machine's busy CPU share since the previous sample
    freq_mhz: float  # the mean frequency of the process's CPUs (once a second)
    nr_throttled: int  # the cgroup's throttled periods so far
    throttled_us: float  # and its throttled time
    cuda_peak_bytes: int  # CUDA's peak allocation since the previous sample


class SamplerFacts(TypedDict, total=False):
    """What a sampler states beside its samples (``PollReply.metrics_info``)."""

    interval_ms: float
    frequency_every_s: float
    sources: dict  # figure -> where it was read ("/proc", "os.times", "sysfs", ...)
    peak_method: str  # "VmHWM reset per sample" or "sampled VmRSS"
    cpus: int
    sampler_nice: int | None
    energy: dict  # collector -> its info and probe: supported, or unsupported and why
    reference: dict  # the reference workload and its timings ({"work", "runs"})
    dropped: int  # samples lost (a failed read, or more than a poll's worth waiting)


INFER_COLUMNS: list[str] = list(InferenceRecord.__annotations__)
LAYER_COLUMNS: list[str] = list(LayerRecord.__annotations__)
METRIC_COLUMNS: list[str] = list(MetricSample.__annotations__)


# ----- hello / setup ------------------------------------------------------------------------
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


# ----- wiring ----------------------------------------------------------------------------
@dataclass
class DataAddress(Message):
    """data_address()'s reply: where partners reach this participant's data server."""

    host: str
    port: int


@dataclass
class PartnerAddress(Message):
    """One partner a participant connects to."""

    omit_none: ClassVar[bool] = True

    instance: str
    host: str
    port: int
    #: the link's key (hex, ``transport.auth.link_key``): the observer derives it from the
    #: run's secret, which participants never see; absent: derived from the participant's
    #: own ``data_secret`` (scripts and tests that drive roles by hand)
    key: str | None = None


@dataclass
class Wiring(Message):
    """connect_partners(): partners by slot, written flat as ``{slot: [address, ...]}``."""

    partners: dict[str, list[PartnerAddress]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """``{slot: [{"instance", "host", "port"}, ...]}``."""
        return {slot: [p.to_dict() for p in peers] for slot, peers in self.partners.items()}

    @classmethod
    def from_dict(cls, data: Any) -> Wiring:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(data, dict):
            raise ProtocolError(f"Wiring: expected a JSON object, got {data!r}")
        return cls({slot: [PartnerAddress.from_dict(p) for p in peers]
                    for slot, peers in data.items()})


@dataclass
class AdmittedPartner(Message):
    """A participant that will connect to this one's data server: its name, the
    addresses it connects from (IPs or host names) and the link's key (hex)."""

    instance: str
    hosts: list[str] = field(default_factory=list)
    key: str = ""


@dataclass
class Admission(Message):
    """admit_partners(): everyone that will connect to this participant's data server.
    Only they are let in, each once, and the server stops listening when all have."""

    partners: list[AdmittedPartner] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """``{"partners": [{"instance", "hosts", "key"}, ...]}``."""
        return {"partners": [p.to_dict() for p in self.partners]}

    @classmethod
    def from_dict(cls, data: Any) -> Admission:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(data, dict) or not isinstance(data.get("partners", []), list):
            raise ProtocolError(f"Admission: expected {{'partners': [...]}}, got {data!r}")
        return cls([AdmittedPartner.from_dict(p) for p in data.get("partners", [])])


# ----- measurements and the partitioner -----------------------------------------------------
@dataclass
class ProfileParams(Message):
    """profile_layers(): how many passes to time (see ``roles/profiling.py``).

    ``full_repeats`` and ``cold_repeats`` default to ``repeats``; ``cold_gap_ms`` to two
    CFS periods of the participant's own quota. ``cpu_quota`` (``{"quota_ms",
    "period_ms", ...}``) is the quota the observer knows the participant runs under, for a
    participant that cannot see its own (a lab host: its cgroup is not mounted in its
    network namespace); what the participant reads itself comes first.
    """

    omit_none: ClassVar[bool] = True

    repeats: int = 5
    warmup: int = 1
    full_repeats: int | None = None
    cold_repeats: int | None = None
    cold_gap_ms: float | None = None
    cpu_quota: dict | None = None


@dataclass
class LinkProbe(Message):
    """probe_link(): payload size (bytes) and round trips; unset means the role's default."""

    omit_none: ClassVar[bool] = True

    size: int | None = None
    repeats: int | None = None


@dataclass
class Warmup(Message):
    """warmup(): unrecorded round trips per end split (a bare number also decodes)."""

    rounds: int = 0

    @classmethod
    def from_dict(cls, data: Any) -> Warmup:
        """A JSON object ``{"rounds": n}`` or the number n itself."""
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return cls(rounds=int(data))
        return super().from_dict(data)


@dataclass
class WarmupDone(Message):
    """warmup()'s reply."""

    seconds: float


@dataclass
class Measurements(Message):
    """prepare_partitioner(): what the observer measured for the partitioner's ``needs``."""

    omit_none: ClassVar[bool] = True

    edge_profile: dict | None = None
    cloud_profile: dict | None = None
    network: dict | None = None
    measured: dict | None = None
    #: chains: each member's start-up profile, and every probed link by "from>to"
    profiles: dict | None = None
    links: dict | None = None
    #: the fidelity probe the head runs before the partitioner's setup (a partitioner's
    #: ``probe_request()``), when a partitioner scored afterwards needs one
    fidelity: dict | None = None
    #: the splits the partitioners scored afterwards choose from these measurements: a
    #: racing sweep races them beside its own contenders
    scored_choices: list | None = None


@dataclass
class PartitionerPlan(Message):
    """prepare_partitioner()'s reply: the sweep's length and the partitioner's decision."""

    sweep_length: int | None = None
    decision: dict | None = None
    #: the start-up fidelity probe's table, when one ran (left out of the JSON otherwise)
    fidelity: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form; without a probe, what it always was."""
        out = super().to_dict()
        if out.get("fidelity") is None:
            out.pop("fidelity", None)
        return out


def partition_context(info: SetupInfo, measured: Measurements) -> dict[str, Any]:
    """The fields of a ``PartitionContext``: the model facts a participant reported at
    set-up plus what the observer measured. The edge builds its partitioner's context
    from this, and the observer the context it scores other partitioners against."""
    return {"layers": info.profile, "points": info.points, "valid_splits": info.valid_splits,
            **measured.to_dict()}


# ----- tasks and polling --------------------------------------------------------------------
@dataclass
class TaskStart(Message):
    """start_task(): a registered task by name, with its parameters."""

    task: str
    params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.params = self.params or {}


@dataclass
class TaskStarted(Message):
    """start_task()'s reply."""

    started: str


@dataclass
class PollRequest(Message):
    """poll(): block up to ``wait_s`` seconds unless the task's state changes."""

    wait_s: float = 0.0


@dataclass
class PollReply(Message):
    """poll()'s reply: the task's state, and the records and logs since the last poll."""

    state: str = "idle"
    task: str | None = None
    done: int = 0
    total: int | None = None
    split: int | None = None
    records: list[InferenceRecord] = field(default_factory=list)
    layers: list[LayerRecord] = field(default_factory=list)
    #: per-stage rows of chain inferences, and measured configurations (pipelines)
    stages: list[dict] = field(default_factory=list)
    configs: list[dict] = field(default_factory=list)
    error: str | None = None
    logs: list[dict] = field(default_factory=list)
    #: the partitioner's decision once the task ended (an adaptive one's final word)
    decision: dict | None = None
    #: the metrics sampler's samples since the last poll (``runtime/sampler.py``: memory,
    #: CPU, throttling, frequency, energy readings), and its sources, energy collectors and
    #: reference timings whenever they changed
    metrics: list[MetricSample] = field(default_factory=list)
    metrics_info: SamplerFacts | None = None

    @property
    def finished(self) -> bool:
        """The task ended, well or not."""
        return self.state in ("done", "failed")


def encode_reply(value: Any) -> str:
    """A reply as its JSON document (a message, a plain value or None)."""
    if isinstance(value, Message):
        return value.to_json()
    return json.dumps(value)


def decode_reply(text: Any) -> Any:
    """The plain value of a JSON reply."""
    if not isinstance(text, str):
        raise ProtocolError(f"expected a JSON reply, got {type(text).__name__}")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ProtocolError(f"reply is not JSON: {exc}: {text[:80]!r}") from None
