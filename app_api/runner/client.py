"""The observer's typed client of one participant's control calls.

One method per call of :mod:`experiment_design.protocol`, typed arguments in,
typed replies out, and the one place remote failures are mapped: a dead
participant is :class:`ParticipantLost` with its stderr tail, anything else a
:class:`TracrError` naming the instance, its host and the call.
"""

from __future__ import annotations

from typing import Any, Protocol

from experiment_design.errors import TracrError
from experiment_design.protocol import (
    ACK,
    BYE,
    DataAddress,
    Environment,
    LinkProbe,
    Measurements,
    Message,
    PartitionerPlan,
    PollReply,
    PollRequest,
    ProfileParams,
    ProtocolError,
    SetupConfig,
    SetupInfo,
    TaskStart,
    TaskStarted,
    Warmup,
    WarmupDone,
    Wiring,
    decode_reply,
)


class ParticipantLost(TracrError):
    """A participant died or its control connection broke during a run."""

    exit_code = 1


class ControlHandle(Protocol):
    """What the client needs of a launched participant (a launcher's handle)."""

    conn: Any
    host_label: str

    def alive(self) -> bool:
        """True while the participant process runs."""

    def stderr_tail(self, n: int = ...) -> str:
        """The last ``n`` lines the participant wrote to stderr."""


def remote_message(exc: BaseException) -> str:
    """The first line of a remote (rpyc) exception, without the remote traceback."""
    text = str(exc).strip()
    for marker in ("\n\n========= Remote Traceback", "\n========= Remote Traceback"):
        text = text.split(marker)[0]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else type(exc).__name__


class ParticipantClient:
    """Calls one participant's ``exposed_`` methods over its control connection.

    Example::

        client = ParticipantClient("edge-1", handle)
        info = client.setup(SetupConfig(instance="edge-1", model={"name": "alexnet"}))
        print(client.hello().torch, info.valid_splits)
    """

    def __init__(self, instance: str, handle: ControlHandle) -> None:
        self.instance = instance
        self.handle = handle

    def call(self, method: str, arg: Message | None = None) -> Any:
        """``exposed_<method>(arg as JSON)``; the reply's plain JSON value."""
        h = self.handle
        try:
            fn = getattr(h.conn.root, method)
            out = fn() if arg is None else fn(arg.to_json())
        except Exception as exc:
            if not h.alive():
                tail = h.stderr_tail(8)
                raise ParticipantLost(
                    f"participant {self.instance} on {h.host_label} died during {method}()",
                    hint=tail or None,
                ) from None
            raise TracrError(f"{self.instance} on {h.host_label}: {method}() failed: "
                             f"{remote_message(exc)}") from None
        try:
            return decode_reply(out)
        except ProtocolError as exc:
            raise TracrError(f"{self.instance} on {h.host_label}: {method}(): {exc}") from None

    # ----- one method per control call ---------------------------------------------------------
    def hello(self) -> Environment:
        """The participant's environment report."""
        return Environment.from_dict(self.call("hello"))

    def setup(self, config: SetupConfig) -> SetupInfo:
        """Build the model (and dataset); the facts of the model as built."""
        return SetupInfo.from_dict(self.call("setup", config))

    def data_address(self) -> DataAddress | None:
        """Where partners reach the participant's data server, if it has one."""
        out = self.call("data_address")
        return None if out is None else DataAddress.from_dict(out)

    def connect_partners(self, wiring: Wiring) -> dict:
        """Open the data channels to the partners; the role's own report."""
        return self.call("connect_partners", wiring) or {}

    def profile_layers(self, params: ProfileParams) -> dict:
        """The participant's start-up profile (``roles/profiling.py``)."""
        return self.call("profile_layers", params)

    def probe_link(self, params: LinkProbe | None = None) -> dict | None:
        """Bandwidth and RTT to the participant's downstream partner, or None."""
        return self.call("probe_link", params or LinkProbe())

    def warmup(self, rounds: int) -> WarmupDone:
        """Unrecorded warm-up round trips."""
        return WarmupDone.from_dict(self.call("warmup", Warmup(rounds=rounds)))

    def prepare_partitioner(self, measured: Measurements) -> PartitionerPlan | None:
        """Set up the participant's partitioner, or None when its role has none."""
        out = self.call("prepare_partitioner", measured)
        return None if out is None else PartitionerPlan.from_dict(out)

    def start_task(self, task: TaskStart) -> TaskStarted:
        """Start a task in the participant's background thread."""
        return TaskStarted.from_dict(self.call("start_task", task))

    def poll(self, wait_s: float = 0.0) -> PollReply:
        """Records, layer rows, logs and task state since the last poll."""
        return PollReply.from_dict(self.call("poll", PollRequest(wait_s=wait_s)))

    def finish(self) -> None:
        """End a running ``wait`` task."""
        self._ack("finish", ACK)

    def cancel(self) -> None:
        """Ask the running task to stop at its next step."""
        self._ack("cancel", ACK)

    def heartbeat(self) -> None:
        """Keep the participant's idle watchdog quiet."""
        self._ack("heartbeat", ACK)

    def shutdown(self) -> None:
        """Stop the participant shortly after it replies."""
        self._ack("shutdown", BYE)

    def _ack(self, method: str, want: str) -> None:
        out = self.call(method)
        if out != want:
            raise TracrError(f"{self.instance} on {self.handle.host_label}: {method}() "
                             f"answered {out!r}, expected {want!r}")
