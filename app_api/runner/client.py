"""The observer's typed client of one participant's control calls.

One method per call of :mod:`experiment_design.protocol`, typed arguments in,
typed replies out, and the one place remote failures are mapped: a dead
participant is :class:`ParticipantLost` with its stderr tail, anything else a
:class:`TracrError` naming the instance, its host and the call.

It is also the one place a call waits, and every wait is bounded: each call is
sent as rpyc's asynchronous request and awaited in short slices, checking
between them that the participant still runs and is not silent for its
liveness timeout (:class:`ParticipantLost`), the caller's ``guard`` (Ctrl-C,
``run.timeout_s``, another participant lost: it raises), and the call's own
deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from app_api.launch.base import STARTUP_TIMEOUT_S, ParticipantLost
from experiment_design.errors import TracrError
from experiment_design.protocol import (
    ACK,
    BYE,
    LIVENESS_TIMEOUT_S,
    Admission,
    DataAddress,
    Environment,
    GraphPlan,
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

#: how often a waiting call looks at liveness, the guard and its deadline
SLICE_S = 0.1
#: calls that build, measure or connect may take long (bounded by run.startup_timeout_s)
LONG_CALLS = frozenset({"setup", "connect_partners", "profile_layers", "probe_link", "warmup",
                        "prepare_partitioner"})
#: every other call answers at once (poll waits at most its own wait_s)
SHORT_CALL_S = 60.0

__all__ = ["CallStuck", "ControlHandle", "ParticipantClient", "ParticipantLost", "remote_message"]


class ControlHandle(Protocol):
    """What the client needs of a launched participant (a launcher's handle)."""

    conn: Any
    host_label: str

    def alive(self) -> bool:
        """True while the participant process runs."""

    def silent_for(self) -> float:
        """Seconds since anything arrived from the participant."""

    def stderr_tail(self, n: int = ...) -> str:
        """The last ``n`` lines the participant wrote to stderr."""


class CallStuck(ParticipantLost):
    """A participant that is alive (its heartbeats arrive) but did not answer a call within
    the call's bound: as good as lost, so the run ends by itself (exit 1), keeps what was
    measured and stops the participant, never asked again."""


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

    def __init__(self, instance: str, handle: ControlHandle, *,
                 guard: Callable[[], None] | None = None,
                 liveness_s: float = LIVENESS_TIMEOUT_S,
                 long_call_s: float = STARTUP_TIMEOUT_S) -> None:
        self.instance = instance
        self.handle = handle
        self.guard = guard
        self.liveness_s = liveness_s
        self.long_call_s = long_call_s

    def call(self, method: str, arg: Message | None = None, timeout: float | None = None) -> Any:
        """``exposed_<method>(arg as JSON)``; the reply's plain JSON value.

        Waits at most ``timeout`` seconds (default: ``long_call_s`` for :data:`LONG_CALLS`,
        :data:`SHORT_CALL_S` otherwise), and less when the participant dies or goes
        silent or the guard raises.
        """
        from rpyc.core import consts, netref

        h = self.handle
        if timeout is None:
            timeout = self.long_call_s if method in LONG_CALLS else SHORT_CALL_S
        deadline = time.monotonic() + timeout
        try:
            args = () if arg is None else (arg.to_json(),)
            reply = netref.asyncreq(h.conn.root, consts.HANDLE_CALLATTR, method, args, ())
            # Served in slices, to check liveness and Ctrl-C between them. Never by giving
            # the reply an expiry: rpyc drops a reply that lands after its expiry, and one
            # slower to receive than a slice (a poll() with many rows, a loaded host) would
            # then be lost and the call hang until its whole timeout.
            while not reply.ready:
                h.conn.serve(SLICE_S, waiting=lambda: not reply.ready)
                if not reply.ready:
                    self._check(method, deadline, timeout)
            out = reply.value
        except TracrError:
            raise
        except Exception as exc:
            if not h.alive():
                tail = h.stderr_tail(8)
                raise ParticipantLost(
                    f"participant {self.instance} on {h.host_label} {_ended(h)} during {method}()",
                    hint=tail or None,
                ) from None
            raise TracrError(f"{self.instance} on {h.host_label}: {method}() failed: "
                             f"{remote_message(exc)}") from None
        try:
            return decode_reply(out)
        except ProtocolError as exc:
            raise TracrError(f"{self.instance} on {h.host_label}: {method}(): {exc}") from None

    def _check(self, method: str, deadline: float, timeout: float) -> None:
        """Between two slices of a wait: raise when it must end."""
        h = self.handle
        if self.guard is not None:
            self.guard()
        if not h.alive():
            raise ParticipantLost(
                f"participant {self.instance} on {h.host_label} {_ended(h)} during {method}()",
                hint=h.stderr_tail(8) or None,
            )
        if h.silent_for() > self.liveness_s:
            raise ParticipantLost(
                f"participant {self.instance} on {h.host_label} silent for "
                f"{self.liveness_s:.0f} s (lost) during {method}()",
                hint=lost_hint(h),
            )
        if time.monotonic() > deadline:
            raise CallStuck(
                f"{self.instance} on {h.host_label}: {method}() did not answer within "
                f"{timeout:.0f} s", hint="the participant is alive but its call is stuck")

    # ----- one method per control call ---------------------------------------------------------
    def hello(self) -> Environment:
        """The participant's environment report."""
        return Environment.from_dict(self.call("hello"))

    def setup(self, config: SetupConfig) -> SetupInfo:
        """Build the model (and dataset); the facts of the model as built."""
        return SetupInfo.from_dict(self.call("setup", config))

    def check_graph(self, plan: GraphPlan) -> str:
        """Have the participant compare ``plan`` with the graph it built (an error names the
        first node that differs); ``"ok"`` when they agree."""
        return self.call("check_graph", plan)

    def data_address(self) -> DataAddress | None:
        """Where partners reach the participant's data server, if it has one."""
        out = self.call("data_address")
        return None if out is None else DataAddress.from_dict(out)

    def connect_partners(self, wiring: Wiring) -> dict:
        """Open the data channels to the partners; the role's own report."""
        return self.call("connect_partners", wiring) or {}

    def admit_partners(self, admission: Admission) -> dict:
        """Tell the participant's data server whom to let in; the role's own report."""
        return self.call("admit_partners", admission) or {}

    def profile_layers(self, params: ProfileParams) -> dict:
        """The participant's start-up profile (``roles/profiling.py``)."""
        return self.call("profile_layers", params)

    def probe_link(self, params: LinkProbe | None = None) -> dict | None:
        """Bandwidth and RTT to the participant's downstream partner, or None."""
        return self.call("probe_link", params or LinkProbe())

    def probe_links(self) -> dict[str, dict]:
        """Bandwidth and RTT to each of a chain member's downstream partners, by
        ``"member>partner"``."""
        return self.call("probe_links") or {}

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

    def shutdown(self, timeout: float = 2.0) -> None:
        """Stop the participant shortly after it replies (waiting ``timeout`` at most)."""
        self._ack("shutdown", BYE, timeout)

    def _ack(self, method: str, want: str, timeout: float | None = None) -> None:
        out = self.call(method, timeout=timeout)
        if out != want:
            raise TracrError(f"{self.instance} on {self.handle.host_label}: {method}() "
                             f"answered {out!r}, expected {want!r}")


def _ended(h: ControlHandle) -> str:
    """How ``h`` ended: its launcher's words (``was cut off (ssh: ...)``), else ``died``."""
    ended = getattr(h, "ended", None)
    return ended() if callable(ended) else "died"


#: the header faulthandler writes above a dump of every thread's stack
DUMP_HEADER = "Timeout ("


def lost_hint(h: ControlHandle) -> str:
    """The hint of a participant lost to silence: the likely causes, and the end of what it
    wrote to stderr. A participant whose heartbeat thread could not run for a while writes
    every thread's stack there (the thread that held it among them): the last such dump is
    kept whole, whatever its length; without one, the last 40 lines."""
    hint = ("no heartbeat arrived (a device off, a link down, a stopped process); "
            "run.liveness_timeout_s sets how long to wait")
    lines = h.stderr_tail(200).splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(DUMP_HEADER)]
    tail = "\n".join(lines[starts[-1]:] if starts else lines[-40:])
    return f"{hint}\nits stderr ended with:\n{tail}" if tail else hint
