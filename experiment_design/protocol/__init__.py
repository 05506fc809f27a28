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
    probe_links()          -                 {"this>partner": {...}, ...} (chain members)
    warmup(w)              Warmup            WarmupDone
    prepare_partitioner(m) Measurements      PartitionerPlan or null
    start_task(t)          TaskStart         TaskStarted
    poll(p)                PollRequest       PollReply
    finish() / cancel() / heartbeat()        "ok"
    shutdown()                               "bye"

JSON strings stay the wire format because rpyc passes lists and dicts by
reference (every access a round trip) and pickle is off. The records that
``poll`` carries have their columns defined here once (:data:`INFER_COLUMNS`,
:data:`LAYER_COLUMNS`, :data:`METRIC_COLUMNS`, :data:`STAGE_COLUMNS`,
:data:`CONFIG_COLUMNS`), and the observer's own ``holds.csv`` beside them
(:data:`HOLD_COLUMNS`); the results store writes them.

The package holds one module per job, and this one names them all:
:mod:`~experiment_design.protocol.wire` (the ready line, the heartbeat, the JSON form of
a message), :mod:`~experiment_design.protocol.records` (the records' columns),
:mod:`~experiment_design.protocol.setup` (hello, setup, check_graph),
:mod:`~experiment_design.protocol.wiring` (partners),
:mod:`~experiment_design.protocol.measurements` (the start-up measurements and the
partitioner) and :mod:`~experiment_design.protocol.tasks` (tasks and polling).
"""


from __future__ import annotations

from experiment_design.protocol.measurements import (
    CpuQuota,
    LinkFigures,
    LinkProbe,
    Measurements,
    PartitionerPlan,
    ProfileParams,
    Warmup,
    WarmupDone,
    partition_context,
)
from experiment_design.protocol.records import (
    CONFIG_COLUMNS,
    HOLD_COLUMNS,
    INFER_COLUMNS,
    LAYER_COLUMNS,
    METRIC_COLUMNS,
    STAGE_COLUMNS,
    ConfigRecord,
    HoldRecord,
    InferenceRecord,
    LayerRecord,
    MetricSample,
    SamplerFacts,
    StageRecord,
)
from experiment_design.protocol.setup import (
    DatasetConfig,
    Environment,
    GraphPlan,
    ModelConfig,
    PartitionerConfig,
    PipelineConfig,
    Prepared,
    RunConfig,
    SetupConfig,
    SetupInfo,
    TransportConfig,
)
from experiment_design.protocol.tasks import (
    LogEntry,
    PollReply,
    PollRequest,
    TaskStart,
    TaskStarted,
)
from experiment_design.protocol.wire import (
    ACK,
    ALIVE_LINE,
    BYE,
    HEARTBEAT_S,
    LIVENESS_TIMEOUT_S,
    PARTICIPANT_MODULE,
    READY_PREFIX,
    Message,
    ProtocolError,
    Ready,
    decode_reply,
    encode_reply,
)
from experiment_design.protocol.wiring import (
    Admission,
    AdmittedPartner,
    DataAddress,
    PartnerAddress,
    Wiring,
)

__all__ = [
    "ACK",
    "ALIVE_LINE",
    "Admission",
    "AdmittedPartner",
    "BYE",
    "CONFIG_COLUMNS",
    "ConfigRecord",
    "CpuQuota",
    "DataAddress",
    "DatasetConfig",
    "Environment",
    "GraphPlan",
    "HEARTBEAT_S",
    "HOLD_COLUMNS",
    "HoldRecord",
    "INFER_COLUMNS",
    "InferenceRecord",
    "LAYER_COLUMNS",
    "LIVENESS_TIMEOUT_S",
    "LayerRecord",
    "LinkFigures",
    "LinkProbe",
    "LogEntry",
    "METRIC_COLUMNS",
    "Measurements",
    "Message",
    "MetricSample",
    "ModelConfig",
    "PARTICIPANT_MODULE",
    "PartitionerConfig",
    "PartitionerPlan",
    "PartnerAddress",
    "PipelineConfig",
    "PollReply",
    "PollRequest",
    "Prepared",
    "ProfileParams",
    "ProtocolError",
    "READY_PREFIX",
    "Ready",
    "RunConfig",
    "STAGE_COLUMNS",
    "SamplerFacts",
    "SetupConfig",
    "SetupInfo",
    "StageRecord",
    "TaskStart",
    "TaskStarted",
    "TransportConfig",
    "Warmup",
    "WarmupDone",
    "Wiring",
    "decode_reply",
    "encode_reply",
    "partition_context",
]
