"""ChainServer: the serving side of a stage in a chain (every participant but the head).

It receives an inference from upstream, runs its range of layers, sends what crosses its
outgoing cut downstream (or, as the last stage, replies), and relays each reply back
upstream with its own record added. In latency mode it does all of that on the thread
that received; in throughput mode (``"pipe": true``) it receives, computes and sends on
three threads with bounded queues between them. What a frame and a record hold is told in
:mod:`experiment_design.runtime.chain`.

torch, the split engine and the transport (which loads torch) are imported where they are
used: ``tracr experiment validate`` imports this module through the roles and loads no
torch (``tests/unit/test_cli_experiment.py``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from experiment_design.runtime.clocks import clocks, handoff_mark, handoff_wait
from experiment_design.runtime.handoff import get_unless_stopped, put_unless_stopped
from experiment_design.runtime.route import Route, run_range

log = logging.getLogger(__name__)

#: how long an idle relay sleeps before it looks at the stop flag again (a request sent
#: on wakes it at once: this only bounds how often an idle stage's thread runs)
_IDLE_S = 1.0


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
               "t_arrive": time.perf_counter_ns(), "decode_ms": rstats.decode_ms, "recv_ms": rstats.recv_ms,
               "bytes_in": rstats.encoded_bytes, "queue": self.jobs.qsize()}
        job = _Job(header, tensors, ch, rec)
        if header.get("pipe"):
            self._start_pipeline()
            put_unless_stopped(self.jobs, job, self.owner.stop_event)
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
        while (job := get_unless_stopped(self.jobs, stop)) is not None:
            self.compute(job)
            if not put_unless_stopped(self.sends, job, stop):
                return

    def _send_loop(self) -> None:
        stop = self.owner.stop_event
        while (job := get_unless_stopped(self.sends, stop)) is not None:
            try:
                self.forward(job)
            except Exception as exc:  # a broken link: the head's deadline reports it
                log.warning("stage send failed: %s", exc)

    # -- computing ---------------------------------------------------------------------------
    def compute(self, job: _Job) -> None:
        """Run this stage's layers of ``job`` (errors are recorded, never raised)."""
        import torch  # here, not at the top: see the module docstring

        sm = self.owner.split_model
        rec = job.record
        try:
            route = Route.from_header(job.header)
            a, b = route.bounds(rec["hop"], sm.n)
            rec.update(a=a, b=b)
            tensors = job.tensors
            dev = self.owner.device
            if str(dev) != "cpu":
                d0 = time.perf_counter_ns()
                # plain values (ints, sizes) cross beside the tensors and stay as they are
                tensors = {k: v.to(dev) if isinstance(v, torch.Tensor) else v
                           for k, v in tensors.items()}
                torch.cuda.synchronize(dev)
                rec["decode_ms"] += (time.perf_counter_ns() - d0) / 1e6
            with torch.inference_mode():
                rec["t_start"], c0 = clocks()
                rec["proc_cpu_ms"] = c0 / 1e6  # the process's CPU clock: see probe_overhead
                out, layers = run_range(sm, a, b, tensors, timed=True,
                                        last=rec["hop"] == route.k - 1)
                rec["t_end"], c1 = clocks()
            rec["handoff0"] = handoff_mark()
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
        from experiment_design.split import flatten_output  # loads torch: see the docstring

        rec, header = job.record, job.header
        route = Route.from_header(header)
        hop = rec["hop"]
        last = hop == route.k - 1
        piped = bool(header.get("pipe"))  # the request's mode (a reply's header has none)
        if last or job.error:
            outs = {} if job.error else {f"out{i}": t for i, t in
                                         enumerate(flatten_output(job.out))}
            reply = {"op": "result", "id": header.get("id"), "head": route.route[0],
                     "stages": [rec], "decode_ms": rec["decode_ms"], "compute_ms": rec.get("compute_ms"),
                     "cpu_ms": rec.get("cpu_ms"), "layers": rec.get("layers", [])}
            if job.error:
                reply["error"] = f"{self.owner.instance}: {job.error}"
            self._send(job.upstream, reply, outs, rec, piped)
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
            self._send(down, {**header, "hop": hop + 1}, job.out, rec, piped)
        except BaseException:
            with self._owes:  # nothing was sent: nothing is owed
                if self.pending.pop(key, None) is not None:
                    self.owed[nxt] = max(0, self.owed.get(nxt, 0) - 1)
            raise

    def _send(self, ch: Any, header: dict, tensors: dict, rec: dict, piped: bool) -> None:
        # latency mode computes and sends on the frame's own thread; throughput mode's
        # send thread is another, and its wait for that thread is the budget's queue
        handoff_wait(rec, same_thread=not piped)
        sent = ch.send(header, tensors)
        rec.update(t_sent=time.perf_counter_ns(), encode_ms=sent.encode_ms, send_ms=sent.send_ms,
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
        from experiment_design.transport.errors import TransportError  # loads torch

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
