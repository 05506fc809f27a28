"""The records ``poll()`` carries, one row of a results file each (``inferences.csv``,
``layers.csv``, ``metrics.csv``, ``stages.csv``, ``configs.csv``): their columns, defined
once, in file order."""

from __future__ import annotations

from typing import Any, TypedDict


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
    # collector -> its info and probe: supported, or unsupported and why (open: each
    # collector, a user's included, reports its own)
    energy: dict
    reference: dict  # the reference workload and its timings ({"work", "runs"})
    dropped: int  # samples lost (a failed read, or more than a poll's worth waiting)


class StageRecord(TypedDict, total=False):
    """One stage of one inference of a chain, one row of ``stages.csv``: the stage's layers
    (``first``..``last``), how many inferences waited in its queue when this one arrived,
    its durations, the bytes it sent on (and of those, forwarded unchanged: long skip
    connections), and its times in ms on its own clock (``t_*``; one clock for every host
    of the lab)."""

    inference: int
    config: str
    mode: str
    hop: int
    instance: str  # the stage (else set by the observer)
    first: int
    last: int
    queue: int
    decode_ms: float
    compute_ms: float
    cpu_ms: float
    encode_ms: float
    send_ms: float
    bytes_out: int
    forwarded_bytes: int
    t_arrive_ms: float
    t_start_ms: float
    t_end_ms: float
    t_sent_ms: float
    cpu_wait_ms: float  # latency mode: the hand-off's run-queue wait (empty: not kept)
    handoff_cpu_ms: float  # latency mode: the CPU time the hand-off's thread ran
    handoff_others_cpu_ms: float  # ... and the process's other threads meanwhile
    error: str


class HoldRecord(TypedDict, total=False):
    """One hold of a lab host by the lab's CPU pacer (``lab up --cpu-mode duty``), for one
    instance on that host, one row of ``holds.csv``: from the stop to the continue, in ms
    on the lab's one clock (``perf_counter``, as ``stages.csv``). The row with no instance
    says where the pacer's record begins (``t_stop_ms``): holds before it are unknown."""

    instance: str
    host: str
    t_stop_ms: float
    t_cont_ms: float


class ConfigRecord(TypedDict, total=False):
    """One measured configuration of a pipeline sweep (a chain of stages cut at ``cuts``,
    run in one mode at one bandwidth), one row of ``configs.csv``.

    ``inferences`` counts the inferences attempted, failed ones (``errors``) included;
    timings and rates are over the successful ones; ``bytes_per_inference`` is the encoded
    bytes crossing every link of the chain for one inference; ``bound_per_s`` is the
    throughput the slowest stage allows; the ``predicted_`` columns are empty when nothing
    predicted the configuration. A participant's row may carry more beside the columns
    (``stages``: the per-stage prediction and measurement; ``llm``: a generation's
    figures), which the observer puts in the summary, not in the file."""

    config: str  # the cuts' label (``8/40``; ``unsplit``), derived by the store
    cuts: list[int] | str  # written joined with ";"
    chain: list[str] | str  # written joined with ";"
    mode: str
    bandwidth: str | None  # the shaped link's rate (``"8MB/s"``); None: unshaped
    batch: int
    in_flight: int
    inferences: int
    items: int
    errors: int
    throughput_per_s: float
    items_per_s: float
    latency_ms_p50: float
    latency_ms_p95: float
    latency_ms_mean: float
    bound_per_s: float
    bytes_per_inference: float
    predicted_throughput_per_s: float
    predicted_latency_ms: float


INFER_COLUMNS: list[str] = list(InferenceRecord.__annotations__)
LAYER_COLUMNS: list[str] = list(LayerRecord.__annotations__)
METRIC_COLUMNS: list[str] = list(MetricSample.__annotations__)
STAGE_COLUMNS: list[str] = list(StageRecord.__annotations__)
CONFIG_COLUMNS: list[str] = list(ConfigRecord.__annotations__)
HOLD_COLUMNS: list[str] = list(HoldRecord.__annotations__)
