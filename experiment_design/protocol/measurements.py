"""profile_layers(), probe_link(), warmup() and prepare_partitioner(): the start-up
measurements and the partitioner they set up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, TypedDict

from experiment_design.protocol.setup import SetupInfo
from experiment_design.protocol.wire import Message


class CpuQuota(TypedDict, total=False):
    """A CFS CPU quota (``roles/profiling.py``'s ``cpu_quota``): ``quota_ms`` of CPU every
    ``period_ms``; the lab's report of a host may say more (how the share is enforced)."""

    quota_ms: float
    period_ms: float
    fraction: float  # quota / period: the share of one core it allows


class LinkFigures(TypedDict, total=False):
    """What probing a link measured (``transport/probe.py``; an echo probe gives the first
    three): its round trip, its bandwidth, and the CPU a byte costs either end."""

    partner: str
    rtt_ms: float
    bandwidth_Bps: float
    send_ns_per_byte: float | None
    recv_ns_per_byte: float | None
    samples: list[dict]  # each timed round: {"bytes", "ms"}


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
    cpu_quota: CpuQuota | None = None


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

    #: start-up profiles (``roles/profiling.py``'s document: per-layer times, full passes,
    #: CPU quota, ...) stay mappings: the profiler adds figures that partitioners read
    #: by name, and a user's partitioner may read ones the protocol does not name
    edge_profile: dict | None = None
    cloud_profile: dict | None = None
    network: LinkFigures | None = None
    #: measured per-split times (split -> ms) from the manifest
    measured: dict[int | str, float] | None = None
    #: chains: each member's start-up profile, and every probed link by "from>to"
    profiles: dict[str, dict] | None = None
    links: dict[str, LinkFigures] | None = None
    #: the fidelity probe the head runs before the partitioner's setup (a partitioner's
    #: ``probe_request()``: open, each partitioner asks in its own terms), when a
    #: partitioner scored afterwards needs one
    fidelity: dict | None = None
    #: the splits the partitioners scored afterwards choose from these measurements: a
    #: racing sweep races them beside its own contenders
    scored_choices: list[int] | None = None


@dataclass
class PartitionerPlan(Message):
    """prepare_partitioner()'s reply: the sweep's length and the partitioner's decision."""

    sweep_length: int | None = None
    #: the partitioner's own account of what it chose and why (open: each says its own)
    decision: dict | None = None
    #: the start-up fidelity probe's table, when one ran (left out of the JSON otherwise;
    #: see ``runtime/fidelity.py``)
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
