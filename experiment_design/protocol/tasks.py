"""start_task() and poll(): a task started by name, and what it reports while it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from experiment_design.protocol.records import (
    ConfigRecord,
    InferenceRecord,
    LayerRecord,
    MetricSample,
    SamplerFacts,
    StageRecord,
)
from experiment_design.protocol.wire import Message


class LogEntry(TypedDict):
    """One log record of the participant (``runtime/logcapture.py``), shown by the observer."""

    t: float  # Unix seconds
    level: str
    name: str
    msg: str


@dataclass
class TaskStart(Message):
    """start_task(): a registered task by name, with its parameters."""

    task: str
    #: the task's own parameters (open: each task declares its own)
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
    stages: list[StageRecord] = field(default_factory=list)
    configs: list[ConfigRecord] = field(default_factory=list)
    error: str | None = None
    logs: list[LogEntry] = field(default_factory=list)
    #: the partitioner's decision once the task ended (an adaptive one's final word; open:
    #: each partitioner says its own)
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
