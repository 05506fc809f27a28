"""The data plane of a chain of stages: one inference visits participants in a route.

A *route* names the participants an inference visits, in order, and the cuts between
them: with ``route = (p0, p1, ..., p_{k-1})`` and ``cuts = (c1, ..., c_{k-1})``,
participant ``p_i`` runs layers ``c_i + 1 .. c_{i+1}`` (``c_0 = 0``, ``c_k = n``).
``p0`` (the head) holds the inputs; every tensor goes straight from ``p_i`` to
``p_{i+1}`` over their data channel, never through the observer; the last stage's
output travels back along the same channels, each stage adding its own record, so the
head measures end-to-end latency on one clock. The edge/cloud pair is the route
``(edge, cloud)`` with one cut.

Two modes share the frames and the records:

- **latency**: one inference in the chain at a time; each stage receives, computes
  and sends on the thread that received (no hand-offs inside a measurement).
- **throughput** (``"pipe": true`` in the frame): several inferences in flight. Each
  stage receives on one thread, computes on another and sends on a third, with bounded
  queues between them, so its compute thread never waits on a socket; a full queue
  stops the receiver, and TCP's window then holds back the stage before.

A stage's record (one per inference, carried back in the reply's ``stages`` list) holds
its layers, its times on its own clock (``t_*``, ``time.perf_counter_ns``), what it
computed, sent and forwarded, and how many inferences waited in its queue on arrival.

Where each part lives: the route and a range's run in :mod:`~experiment_design.runtime.route`,
the serving stage (:class:`ChainServer`) in :mod:`~experiment_design.runtime.chain_server`,
the queues between a stage's threads in :mod:`~experiment_design.runtime.handoff`, and the
head (:class:`ChainHead`, which feeds a route and collects its replies as
:class:`Completed` inferences) here. Route, run_range and ChainServer are imported from
here too.

torch and the transport (which loads torch) are imported where they are used:
``tracr experiment validate`` imports the chain through the roles and loads no torch
(``tests/unit/test_cli_experiment.py``).
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.runtime.chain_server import ChainServer
from experiment_design.runtime.clocks import clocks, handoff_mark, handoff_wait
from experiment_design.runtime.handoff import POLL_S, get_unless_stopped, put_unless_stopped
from experiment_design.runtime.route import Route, run_range

__all__ = ["ChainHead", "ChainServer", "Completed", "Route", "run_range"]


@dataclass
class Completed:
    """One inference as the head saw it: its own record (hop 0), the reply and its times."""

    iid: int
    route: Route
    record: dict[str, Any]
    t_done: int = 0
    reply: dict[str, Any] | None = None
    outputs: dict[str, Any] | None = None
    error: str | None = None
    link_error: bool = False
    #: the CodecConfig the head sends the crossing tensors with (None: the channel's)
    codec: Any = None

    @property
    def e2e_ms(self) -> float:
        """Head compute start to reply received (or to the end of compute if alone)."""
        return (self.t_done - self.record["t_start"]) / 1e6

    def stages(self) -> list[dict[str, Any]]:
        """Every stage's record, head first."""
        rest = (self.reply or {}).get("stages") or []
        return [self.record, *sorted(rest, key=lambda r: int(r.get("hop", 0)))]


class ChainHead:
    """The head's side: computes its layers on its inputs, sends them into the route and
    collects replies, one inference at a time (:meth:`once`) or several in flight
    (:meth:`pipelined`). ``owner`` provides ``split_model``, ``instance``,
    ``downstream`` (partner name -> data channel) and ``cancel_event``/``stop_event``."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner

    def _compute(self, route: Route, x: Any, iid: int) -> Completed:
        import torch  # here, not at the top: see the module docstring

        sm = self.owner.split_model
        a, b = route.bounds(0, sm.n)
        rec: dict[str, Any] = {"instance": self.owner.instance, "hop": 0, "a": a, "b": b,
                               "queue": 0}
        c = Completed(iid, route, rec)
        with torch.inference_mode():
            rec["t_start"], c0 = clocks()
            rec["proc_cpu_ms"] = c0 / 1e6
            out, layers = run_range(sm, 0, b, {sm.points[0].crossing[0]: x}, timed=True,
                                    last=route.k == 1)
            rec["t_end"], c1 = clocks()
        rec["handoff0"] = handoff_mark()
        rec.update(compute_ms=(rec["t_end"] - rec["t_start"]) / 1e6, cpu_ms=(c1 - c0) / 1e6,
                   layers=[[int(i), float(ms)] for i, ms in layers])
        c.outputs = out  # crossing tensors, or the output when the head runs everything
        return c

    def _header(self, c: Completed, pipe: bool) -> dict[str, Any]:
        h = {"op": "infer", "id": c.iid, "head": self.owner.instance, "hop": 1,
             "split": c.route.cuts[0], **c.route.to_header()}
        if pipe:
            h["pipe"] = True
        return h

    def _send(self, c: Completed, pipe: bool) -> None:
        down = self.owner.downstream[c.route.route[1]]
        header = self._header(c, pipe)
        handoff_wait(c.record, same_thread=not pipe)
        sent = down.send(header, c.outputs, codec=c.codec)
        c.record.update(t_sent=time.perf_counter_ns(), encode_ms=sent.encode_ms, send_ms=sent.send_ms,
                        bytes_raw=sent.raw_bytes, bytes_encoded=sent.encoded_bytes,
                        n_crossing=len(c.outputs))
        c.outputs = None

    @staticmethod
    def _finish(c: Completed, header: dict[str, Any], tensors: dict[str, Any]) -> None:
        c.t_done = time.perf_counter_ns()
        c.reply, c.outputs = header, tensors
        if header.get("error"):
            c.error = str(header["error"])

    def once(self, route: Route, x: Any, iid: int, codec: Any = None) -> Completed:
        """One inference, alone in the chain (latency mode); the head sends what crosses
        its cut with ``codec`` (a CodecConfig; None: the channel's). A broken link is
        recorded on the result (``link_error``), a compute error on any stage too."""
        from experiment_design.transport.errors import TransportError  # loads torch

        try:
            c = self._compute(route, x, iid)
        except Exception as exc:
            c = Completed(iid, route, {"instance": self.owner.instance, "hop": 0},
                          error=f"{type(exc).__name__}: {exc}", codec=codec)
            return c
        c.codec = codec
        if route.k == 1:
            c.t_done = c.record["t_end"]
            return c
        try:
            self._send(c, pipe=False)
            header, tensors, _ = self.owner.downstream[route.route[1]].recv()
            self._finish(c, header, tensors)
        except (OSError, EOFError, TransportError) as exc:
            c.error = f"link to {route.route[1]} failed: {type(exc).__name__}: {exc}"
            c.link_error = True
        return c

    def probe_overhead(self, route: Route, inputs: list, count: int = 16,
                       pipe: bool = True) -> dict[str, float]:
        """What each participant of ``route`` spends per inference beside its layers, in
        CPU ms: receiving, decoding, sending, relaying the reply, its threads' hand-offs.

        ``count`` unrecorded inferences, one at a time, through throughput mode's threads
        and queues (``pipe``, as a throughput run uses them; else on latency mode's single
        thread), after two that build each range's code. Each participant's process CPU clock is read at the start of its
        compute: between its first and its last inference it spent that much CPU on
        ``count - 1`` inferences, of which its layers took the median of their compute
        windows' CPU each. The rest, per inference, is returned by participant (never
        below 0). Measured on the chain itself because the start-up profile times layers
        only: a middle stage of AlexNet on this machine spent 0.65 ms of CPU per inference
        on 0.11 ms of layers."""
        first = -10 * (count + 3)  # below every recorded inference's id
        for i in range(2):
            c = self.once(route, inputs[i % len(inputs)][0], first + i)
            if c.error:
                raise TracrError(f"overhead probe: {c.error}")
        done: list[Completed] = []
        if pipe and route.k > 1:
            self.pipelined(route, inputs, count, 1, first + 2, done.append)
        else:
            done = [self.once(route, inputs[i % len(inputs)][0], first + 2 + i)
                    for i in range(count)]
        bad = next((c.error for c in done if c.error), None)
        if bad or len(done) < 3:
            raise TracrError(f"overhead probe: {bad or 'too few replies'}")
        per: dict[str, list[tuple[float, float]]] = {}
        for c in done:
            for rec in c.stages():
                if rec.get("proc_cpu_ms") is not None and rec.get("cpu_ms") is not None:
                    per.setdefault(str(rec.get("instance")), []).append(
                        (float(rec["proc_cpu_ms"]), float(rec["cpu_ms"])))
        out = {}
        for name, marks in per.items():
            marks.sort()
            spent = marks[-1][0] - marks[0][0]
            layers = statistics.median(cpu for _, cpu in marks) * (len(marks) - 1)
            out[name] = max(0.0, (spent - layers) / (len(marks) - 1))
        return out

    def probe_busy(self, route: Route, inputs: list, count: int = 24,
                   in_flight: int = 4) -> dict[str, float]:
        """The median CPU ms each participant of ``route`` spends on its layers when
        ``in_flight`` inferences are in the chain at once (``count`` unrecorded ones, the
        first ``in_flight`` left out as the pipeline fills), by participant. A host held
        to a CPU quota and busy all the time is stopped every period, and its layers then
        cost more CPU than in the start-up profile's passes: in the lab at 0.6 core a
        head running mobilenet_v2's layers 1..150 took 1.05x their profiled CPU one
        inference at a time and 1.23x with four in flight."""
        first = -10 * (count + in_flight + 3)  # below every recorded inference's id
        done: list[Completed] = []
        self.pipelined(route, inputs, count, in_flight, first, done.append)
        bad = next((c.error for c in done if c.error), None)
        if bad or len(done) <= in_flight:
            raise TracrError(f"busy probe: {bad or 'too few replies'}")
        per: dict[str, list[float]] = {}
        for c in sorted(done, key=lambda c: c.iid)[in_flight:]:
            for rec in c.stages():
                if rec.get("cpu_ms") is not None:
                    per.setdefault(str(rec.get("instance")), []).append(float(rec["cpu_ms"]))
        return {name: statistics.median(v) for name, v in per.items()}

    def pipelined(self, route: Route, inputs: list, count: int, in_flight: int,
                  first_id: int, on_done: Any) -> int:
        """``count`` inferences with up to ``in_flight`` in the chain at once; ``on_done``
        gets each :class:`Completed` as its reply arrives (on the receiving thread).
        Computing, sending and receiving run on three threads with a bounded queue
        between the first two. Returns how many were completed; stops early (and
        raises) on a broken link, stops feeding on cancel."""
        from experiment_design.transport.errors import TransportError  # loads torch

        if route.k < 2:
            raise TracrError("throughput mode needs a route of at least two participants")
        owner = self.owner
        down = owner.downstream[route.route[1]]
        slots = threading.Semaphore(in_flight)
        sendq: queue.Queue = queue.Queue(maxsize=in_flight)
        waiting: dict[int, Completed] = {}
        more = threading.Condition()
        halt = threading.Event()
        failure: list[BaseException] = []
        fed = [0]
        got = [0]

        def sender() -> None:
            while (c := get_unless_stopped(sendq, halt)) is not None:
                if c is _END:
                    return
                try:
                    self._send(c, pipe=True)
                except Exception as exc:
                    failure.append(exc)
                    halt.set()
                    return

        def receiver() -> None:
            while True:
                with more:  # receive only what is owed: a cancelled feed ends it cleanly
                    while got[0] >= fed[0] and not feeding_done.is_set() and not halt.is_set():
                        more.wait(POLL_S)
                    if halt.is_set() or (got[0] >= fed[0] and feeding_done.is_set()):
                        return
                try:
                    header, tensors, _ = down.recv()
                except (OSError, EOFError, TransportError) as exc:
                    failure.append(exc)
                    halt.set()
                    return
                with more:
                    c = waiting.pop(int(header.get("id", -1)), None)
                    got[0] += 1
                if c is not None:
                    self._finish(c, header, tensors)
                    on_done(c)
                slots.release()

        feeding_done = threading.Event()
        threads = [threading.Thread(target=sender, name="head-send", daemon=True),
                   threading.Thread(target=receiver, name="head-recv", daemon=True)]
        for t in threads:
            t.start()
        stopping = (owner.cancel_event, owner.stop_event, halt)
        try:
            for i in range(count):
                while not slots.acquire(timeout=POLL_S):
                    if any(e.is_set() for e in stopping):
                        break
                if any(e.is_set() for e in stopping):
                    break
                x = inputs[i % len(inputs)][0]
                c = self._compute(route, x, first_id + i)
                with more:
                    waiting[c.iid] = c
                    fed[0] += 1
                    more.notify()
                if not put_unless_stopped(sendq, c, halt):
                    break
        finally:
            with more:
                feeding_done.set()
                more.notify()
            put_unless_stopped(sendq, _END, halt)
        threads[0].join()
        threads[1].join()
        if failure:
            exc = failure[0]
            raise TracrError(f"link to {route.route[1]} failed: {type(exc).__name__}: {exc}")
        return got[0]


_END: Any = object()
