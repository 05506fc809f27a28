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
"""

from __future__ import annotations

import logging
import queue
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.runtime.clocks import clocks

log = logging.getLogger(__name__)

#: how long a blocked queue hand-off waits before it looks at the stop flag again
_POLL_S = 0.1
#: how long an idle relay sleeps before it looks at the stop flag again (a request sent
#: on wakes it at once: this only bounds how often an idle stage's thread runs)
_IDLE_S = 1.0


@dataclass(frozen=True)
class Route:
    """Who runs which layers of one inference (see the module docstring)."""

    route: tuple[str, ...]
    cuts: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.route) < 1 or len(self.cuts) != len(self.route) - 1:
            raise TracrError(f"a route of {len(self.route)} participants needs "
                             f"{max(0, len(self.route) - 1)} cuts, got {list(self.cuts)}")
        if any(b < a for a, b in zip(self.cuts, self.cuts[1:], strict=False)):
            raise TracrError(f"cuts must not decrease along the route: {list(self.cuts)}")
        if len(set(self.route)) != len(self.route):
            raise TracrError(f"a participant appears twice in the route {list(self.route)}")

    @property
    def k(self) -> int:
        """Number of stages."""
        return len(self.route)

    def bounds(self, hop: int, n: int) -> tuple[int, int]:
        """The cuts around stage ``hop``: it runs layers ``a + 1 .. b``."""
        a = 0 if hop == 0 else self.cuts[hop - 1]
        b = n if hop == len(self.cuts) else self.cuts[hop]
        return a, b

    @property
    def label(self) -> str:
        """The cuts as a label, e.g. ``"8/40"`` (``"-"`` for one stage)."""
        return "/".join(map(str, self.cuts)) or "-"

    def to_header(self) -> dict[str, Any]:
        """The route's part of a frame header."""
        return {"route": list(self.route), "cuts": list(self.cuts)}

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Route:
        """The route a frame header carries."""
        return cls(tuple(str(r) for r in header["route"]), tuple(int(c) for c in header["cuts"]))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON view."""
        return {**self.to_header(), "label": self.label}


def run_range(sm: Any, a: int, b: int, tensors: dict[str, Any], timed: bool, *,
              last: bool) -> tuple[Any, list]:
    """Layers ``a + 1 .. b`` of split model ``sm`` from the crossing tensors of cut ``a``
    (the input under its crossing name when ``a == 0``): the model output if this is the
    ``last`` stage (then ``b == n``), else the crossing tensors of cut ``b``; with
    per-layer ms if ``timed``."""
    n = sm.n
    if last and b != n:
        raise TracrError(f"the last stage must end at the last cut ({n}), not at {b}")
    if a == 0:
        (x,) = tensors.values()
        return sm.run_full(x, timed=timed) if last else sm.run_prefix(b, x, timed=timed)
    if last:
        return sm.run_suffix(a, tensors, timed=timed)
    if b == n:
        raise TracrError(f"a middle stage cannot end at the last cut ({n}): only the head "
                         "may run every layer and send the output on")
    return sm.run_stage(a, b, tensors, timed=timed)


def _ns() -> int:
    return time.perf_counter_ns()


def _put(q: queue.Queue, item: Any, stop: threading.Event) -> bool:
    """Put ``item`` on a bounded queue, giving up if ``stop`` is set; True if put."""
    while not stop.is_set():
        try:
            q.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _get(q: queue.Queue, stop: threading.Event) -> Any:
    """The next item of ``q``, or None once ``stop`` is set."""
    while not stop.is_set():
        try:
            return q.get(timeout=_POLL_S)
        except queue.Empty:
            continue
    return None


@dataclass
class _Job:
    """One inference passing through a serving stage."""

    header: dict[str, Any]
    tensors: Any
    upstream: Any  # the channel it came on (and its reply goes back on)
    record: dict[str, Any]
    out: Any = None
    error: str | None = None


class ChainServer:
    """The serving side of a stage: receives from upstream, computes its layers, sends
    downstream (or, as the last stage, replies), and relays replies back upstream.

    ``owner`` is the participant: it provides ``split_model``, ``device``, ``instance``,
    ``stop_event`` and ``downstream`` (partner name -> data channel).
    """

    def __init__(self, owner: Any, depth: int = 2) -> None:
        self.owner = owner
        self.depth = depth
        self.jobs: queue.Queue = queue.Queue(maxsize=depth)
        self.sends: queue.Queue = queue.Queue(maxsize=depth)
        self.pending: dict[tuple[str, int], tuple[Any, dict]] = {}
        self._lock = threading.Lock()
        #: partner name -> the thread relaying its replies
        self.relays: dict[str, threading.Thread] = {}
        #: partner name -> replies it owes (requests sent on, a goodbye): its relay reads,
        #: under the channel's liveness deadline, only while one is owed
        self.owed: dict[str, int] = {}
        self._owes = threading.Condition(self._lock)
        self._pipeline: list[threading.Thread] = []
        self.served = 0

    # -- receiving ---------------------------------------------------------------------------
    def handle(self, ch: Any, header: dict[str, Any], tensors: Any, rstats: Any) -> None:
        """One ``infer`` frame from ``ch``: compute and pass it on now (latency mode) or
        queue it for the compute thread (throughput mode)."""
        rec = {"instance": self.owner.instance, "hop": int(header.get("hop", 1)),
               "t_arrive": _ns(), "decode_ms": rstats.decode_ms, "recv_ms": rstats.recv_ms,
               "bytes_in": rstats.encoded_bytes, "queue": self.jobs.qsize()}
        job = _Job(header, tensors, ch, rec)
        if header.get("pipe"):
            self._start_pipeline()
            _put(self.jobs, job, self.owner.stop_event)
        else:
            self.compute(job)
            self.forward(job)

    def _start_pipeline(self) -> None:
        with self._lock:
            if self._pipeline:
                return
            for name, target in (("compute", self._compute_loop), ("send", self._send_loop)):
                t = threading.Thread(target=target, name=f"stage-{name}", daemon=True)
                t.start()
                self._pipeline.append(t)

    def _compute_loop(self) -> None:
        stop = self.owner.stop_event
        while (job := _get(self.jobs, stop)) is not None:
            self.compute(job)
            if not _put(self.sends, job, stop):
                return

    def _send_loop(self) -> None:
        stop = self.owner.stop_event
        while (job := _get(self.sends, stop)) is not None:
            try:
                self.forward(job)
            except Exception as exc:  # a broken link: the head's deadline reports it
                log.warning("stage send failed: %s", exc)

    # -- computing ---------------------------------------------------------------------------
    def compute(self, job: _Job) -> None:
        """Run this stage's layers of ``job`` (errors are recorded, never raised)."""
        import torch

        sm = self.owner.split_model
        rec = job.record
        try:
            route = Route.from_header(job.header)
            a, b = route.bounds(rec["hop"], sm.n)
            rec.update(a=a, b=b)
            tensors = job.tensors
            dev = self.owner.device
            if str(dev) != "cpu":
                d0 = _ns()
                # plain values (ints, sizes) cross beside the tensors and stay as they are
                tensors = {k: v.to(dev) if isinstance(v, torch.Tensor) else v
                           for k, v in tensors.items()}
                torch.cuda.synchronize(dev)
                rec["decode_ms"] += (_ns() - d0) / 1e6
            with torch.inference_mode():
                rec["t_start"], c0 = clocks()
                rec["proc_cpu_ms"] = c0 / 1e6  # the process's CPU clock: see probe_overhead
                out, layers = run_range(sm, a, b, tensors, timed=True,
                                        last=rec["hop"] == route.k - 1)
                rec["t_end"], c1 = clocks()
            rec["compute_ms"] = (rec["t_end"] - rec["t_start"]) / 1e6
            rec["cpu_ms"] = (c1 - c0) / 1e6
            rec["layers"] = [[int(i), float(ms)] for i, ms in layers]
            if b < sm.n:
                kept = {id(t) for t in tensors.values() if isinstance(t, torch.Tensor)}
                rec["forwarded_bytes"] = sum(t.numel() * t.element_size()
                                             for t in out.values() if id(t) in kept)
            job.out = out
        except Exception as exc:  # reported in the reply; the head records it
            log.error("inference %s failed on %s: %s", job.header.get("id"),
                      self.owner.instance, exc)
            job.error = f"{type(exc).__name__}: {exc}"

    # -- sending -----------------------------------------------------------------------------
    def forward(self, job: _Job) -> None:
        """Send ``job`` on: to the next stage, or back upstream as the reply if last
        (or failed)."""
        from experiment_design.split import flatten_output

        rec, header = job.record, job.header
        route = Route.from_header(header)
        hop = rec["hop"]
        last = hop == route.k - 1
        if last or job.error:
            outs = {} if job.error else {f"out{i}": t for i, t in
                                         enumerate(flatten_output(job.out))}
            reply = {"op": "result", "id": header.get("id"), "head": route.route[0],
                     "stages": [rec], "decode_ms": rec["decode_ms"], "compute_ms": rec.get("compute_ms"),
                     "cpu_ms": rec.get("cpu_ms"), "layers": rec.get("layers", [])}
            if job.error:
                reply["error"] = f"{self.owner.instance}: {job.error}"
            self._send(job.upstream, reply, outs, rec)
            self.served += 1
            return
        nxt = route.route[hop + 1]
        down = self.owner.downstream.get(nxt)
        if down is None:
            reply = {"op": "result", "id": header.get("id"), "head": route.route[0],
                     "stages": [rec], "error": f"{self.owner.instance}: no data channel to {nxt}"}
            job.upstream.send(reply, {})
            return
        self._relay(nxt, down)
        key = (route.route[0], int(header["id"]))
        with self._owes:
            self.pending[key] = (job.upstream, rec)
            self._expect(nxt)
        try:
            self._send(down, {**header, "hop": hop + 1}, job.out, rec)
        except BaseException:
            with self._owes:  # nothing was sent: nothing is owed
                if self.pending.pop(key, None) is not None:
                    self.owed[nxt] = max(0, self.owed.get(nxt, 0) - 1)
            raise

    def _send(self, ch: Any, header: dict, tensors: dict, rec: dict) -> None:
        sent = ch.send(header, tensors)
        rec.update(t_sent=_ns(), encode_ms=sent.encode_ms, send_ms=sent.send_ms,
                   bytes_raw=sent.raw_bytes, bytes_encoded=sent.encoded_bytes)

    # -- relaying replies --------------------------------------------------------------------
    def expect(self, name: str) -> None:
        """One more reply is owed by ``name`` (a request or a goodbye about to be sent to
        it): its relay thread reads it, under the link's liveness deadline."""
        with self._owes:
            self._expect(name)

    def _expect(self, name: str) -> None:  # the lock is held
        self.owed[name] = self.owed.get(name, 0) + 1
        self._owes.notify_all()

    def _relay(self, name: str, down: Any) -> None:
        with self._lock:
            if name in self.relays:
                return
            t = self.relays[name] = threading.Thread(
                target=self._relay_loop, args=(name, down), name=f"relay-{name}", daemon=True)
        t.start()

    def _relay_loop(self, name: str, down: Any) -> None:
        """Replies from ``down`` go back on the channel their request came from, with this
        stage's record added (its record was finished when it sent the request on).

        The channel's receive deadline is the link's liveness: a partner that owes a reply
        and stays silent that long is lost. So the relay reads only while ``name`` owes
        one; between configurations, while the head plans or runs a baseline, the link
        may stay idle for as long as the run lasts (it read all the time before, and an
        idle gap of the liveness timeout closed the link for the rest of the run)."""
        from experiment_design.transport.errors import TransportError

        stop = self.owner.stop_event
        while not stop.is_set() and not getattr(down, "closed", False):
            with self._owes:
                if not self.owed.get(name):
                    self._owes.wait(_IDLE_S)
                    continue
            try:
                header, tensors, _ = down.recv()
            except (OSError, EOFError, TransportError) as exc:
                if not stop.is_set():
                    log.info("channel to %s closed: %s", name, exc)
                break
            with self._owes:
                self.owed[name] = max(0, self.owed.get(name, 0) - 1)
            if header.get("op") == "bye":  # the goodbye this stage sent was answered
                break
            key = (str(header.get("head", "")), int(header.get("id", -1)))
            with self._lock:
                entry = self.pending.pop(key, None)
            if entry is None:
                log.warning("reply %s from %s matches no request", header.get("id"), name)
                continue
            upstream, rec = entry
            header["stages"] = [*header.get("stages", []), rec]
            try:
                upstream.send(header, tensors)
            except (OSError, TransportError) as exc:
                log.warning("could not relay a reply upstream: %s", exc)


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
        import torch

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
        sent = down.send(self._header(c, pipe), c.outputs, codec=c.codec)
        c.record.update(t_sent=_ns(), encode_ms=sent.encode_ms, send_ms=sent.send_ms,
                        bytes_raw=sent.raw_bytes, bytes_encoded=sent.encoded_bytes,
                        n_crossing=len(c.outputs))
        c.outputs = None

    @staticmethod
    def _finish(c: Completed, header: dict[str, Any], tensors: dict[str, Any]) -> None:
        c.t_done = _ns()
        c.reply, c.outputs = header, tensors
        if header.get("error"):
            c.error = str(header["error"])

    def once(self, route: Route, x: Any, iid: int, codec: Any = None) -> Completed:
        """One inference, alone in the chain (latency mode); the head sends what crosses
        its cut with ``codec`` (a CodecConfig; None: the channel's). A broken link is
        recorded on the result (``link_error``), a compute error on any stage too."""
        from experiment_design.transport.errors import TransportError

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
        from experiment_design.transport.errors import TransportError

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
            while (c := _get(sendq, halt)) is not None:
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
                        more.wait(_POLL_S)
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
                while not slots.acquire(timeout=_POLL_S):
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
                if not _put(sendq, c, halt):
                    break
        finally:
            with more:
                feeding_done.set()
                more.notify()
            _put(sendq, _END, halt)
        threads[0].join()
        threads[1].join()
        if failure:
            exc = failure[0]
            raise TracrError(f"link to {route.route[1]} failed: {type(exc).__name__}: {exc}")
        return got[0]


_END: Any = object()
