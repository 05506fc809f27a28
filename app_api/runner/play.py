"""Play phase: run each participant's playbook, stream its records, stop early on a loss."""

from __future__ import annotations

import time
from typing import Any

from app_api.launch import ParticipantLost
from app_api.runner.hoststat import lab_cpu_stat
from app_api.runner.llm import take_generations
from app_api.runner.state import RunState, RunTimeout
from experiment_design.errors import TracrError
from experiment_design.protocol import PollReply, TaskStart

POLL_S = 0.25
#: after an abort, tasks get the liveness timeout plus this to end (their own link
#: deadlines end them) before the playbook stops waiting for them
DRAIN_S = 5.0
WAIT = "wait"  # the task a serving participant (the cloud) runs until released


class Playbook:
    """The playbook's progress across participants: whose task runs, how far each got.

    :meth:`run` polls every participant with a running task, streams what it
    reports into the run directory, starts its next task when one ends, and on
    a failure, a lost participant (dead, or silent for the liveness timeout),
    ``run.timeout_s`` or a stop request cancels the rest and releases the
    participants that only serve others. Every wait is bounded: each poll by its
    client, the drain after an abort by the liveness timeout.
    """

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.queues = {i: list(state.manifest.playbook.get(i, [])) for i in state.handles}
        self.current: dict[str, str] = {}  # instance -> the task it runs now
        self.totals = {i: (p or {}).get("sweep_length") for i, p in state.partitioners.items()}
        self.done: dict[str, int] = {}
        self.finished = {i: (0, 0) for i in self.queues}  # (done, total) of completed tasks
        self.split_now: dict[str, Any] = {}
        self.planned = sum(t for t in self.totals.values() if t) or None
        self.aborting = False
        self.aborted_at = 0.0
        self.cancelled = False
        self.dead: set[str] = set()

    def run(self) -> None:
        """Play until every participant's queue is empty (or the run is aborted)."""
        view = self.state.view
        view.start(self.planned)
        for inst in list(self.queues):
            self.start_next(inst)
        while self.current:
            why = self.state.ending()
            if why and not self.aborting:
                self.abort(why)
            if self.aborting and time.monotonic() - self.aborted_at > (
                    self.state.liveness_s + DRAIN_S):
                self.state.errors.append(
                    "tasks still running after the abort: " + ", ".join(sorted(self.current)))
                break
            self.poll_all()
            total = sum(t for t in self.totals.values() if t) or self.planned
            view.update(sum(self.done.values()), total,
                        next(iter(self.split_now.values()), None) if self.split_now else None)
            self.check_alive()
            self.release_servers()
            if self.aborting and not self.cancelled:
                self.cancel_running()
        view.stop()

    def abort(self, error: str, lost: bool = False) -> None:
        """Record why, and stop starting tasks (``lost``: the run ends incomplete for it)."""
        if lost or error == self.state.ending():
            self.state.end(error)
        else:
            self.state.errors.append(error)
        if not self.aborting:
            self.aborted_at = time.monotonic()
        self.aborting = True

    def client(self, inst: str):
        """``inst``'s client: its waits end on the run's limits and ``inst``'s own
        liveness only (a lost partner does not stop the drain of this one's rows)."""
        return self.state.client(inst, watch_all=False)

    def start_next(self, inst: str) -> None:
        """Start ``inst``'s next task, or mark it idle when its queue is empty."""
        if self.queues[inst]:
            task = self.queues[inst].pop(0)
            self.current[inst] = task["task"]
            self.client(inst).start_task(
                TaskStart(task=task["task"], params=task.get("params") or {}))
        else:
            self.current.pop(inst, None)

    def poll_all(self) -> None:
        """One poll of every participant with a task; the busy ones share POLL_S of waiting."""
        busy = [i for i, t in self.current.items() if t != WAIT]
        for inst in list(self.current):
            wait_s = POLL_S / max(1, len(busy)) if inst in busy else 0.0
            try:
                st = self.client(inst).poll(wait_s)
            except RunTimeout:
                raise
            except TracrError as exc:
                lost = isinstance(exc, ParticipantLost)
                if lost:
                    self.dead.add(inst)
                self.abort(str(exc) + ("" if lost or not exc.hint else f"\n{exc.hint}"), lost)
                if lost and exc.hint:
                    self.state.errors.append(exc.hint)  # with the end of its stderr
                self.current.pop(inst, None)
                continue
            self.ingest(inst, st)
            self.advance(inst, st)

    def advance(self, inst: str, st: PollReply) -> None:
        """Book ``inst``'s progress and act on its task's state."""
        if self.current.get(inst) != WAIT:
            if st.total is not None:
                self.totals[inst] = self.finished[inst][1] + (st.total or 0)
            self.done[inst] = self.finished[inst][0] + (st.done or 0)
        if st.split is not None:
            self.split_now[inst] = st.split
        if st.finished:
            self.finished[inst] = (self.done.get(inst, 0), self.totals.get(inst) or 0)
        if st.state == "failed":
            self.abort(f"{inst}: task {st.task} failed: {st.error}")
            self.current.pop(inst, None)
        elif st.state == "done" and not self.aborting:
            self.start_next(inst)
        elif st.state == "done":
            self.current.pop(inst, None)

    def ingest(self, inst: str, st: PollReply) -> None:
        """Stream a poll's records and logs into the run directory and the view."""
        host = self.state.handles[inst].host_label
        for r in st.records:
            r["instance"], r["host"] = inst, host
        for r in st.layers:  # a pipeline's head reports every stage's layers, each by name
            r["instance"] = r.get("instance") or inst
        self.state.writer.add_inferences(st.records)
        self.state.writer.add_layers(st.layers)
        for r in st.stages:
            r["instance"] = r.get("instance") or inst
        self.state.writer.add_stages(st.stages)
        st.configs = take_generations(self.state, st.configs)  # summary.json llm
        if st.configs:
            # a configuration over a shaped lab link is labelled with its rate, so fronts
            # are drawn per bandwidth (a rate sweep's runs, or one run on a shaped lab)
            rate = self.state.facts.link_bandwidth()
            for c in st.configs:
                if rate and not c.get("bandwidth"):
                    c["bandwidth"] = rate
            self.state.configs.extend(st.configs)
            self.state.writer.add_configs([{k: v for k, v in c.items() if k != "stages"}
                                           for c in st.configs])
        for rec in st.logs:
            self.state.view.log(inst, host, rec)
        device = self.state.handles[inst].device
        self.state.metrics.add(inst, st.metrics, st.metrics_info,
                               lambda: lab_cpu_stat(device))
        if st.decision and self.state.partitioners.get(inst):
            self.state.partitioners[inst]["decision"] = st.decision  # the final word

    def check_alive(self) -> None:
        """A participant whose process ended, or that is silent for the liveness timeout,
        is reported once and ends the run."""
        limit = self.state.liveness_s
        for inst, h in self.state.handles.items():
            if inst in self.dead:
                continue
            if not h.alive():
                self.dead.add(inst)
                self.abort(f"participant {inst} on {h.host_label} {h.ended()}", True)
                self.current.pop(inst, None)
            elif h.silent_for() > limit:
                self.dead.add(inst)
                self.abort(f"participant {inst} on {h.host_label} silent for {limit:.0f} s "
                           "(lost)", True)
                self.current.pop(inst, None)

    def release_servers(self) -> None:
        """Release the serving participants once nothing else runs (or the run aborts)."""
        waiting = [i for i, t in self.current.items() if t == WAIT]
        if waiting and (self.aborting or len(waiting) == len(self.current)):
            for inst in waiting:
                try:
                    self.client(inst).finish()
                except TracrError as exc:
                    self.state.errors.append(str(exc))
                    self.current.pop(inst, None)

    def cancel_running(self) -> None:
        """Cancel every running task once (the rows measured so far are kept)."""
        self.cancelled = True
        for inst in [i for i, t in self.current.items() if t != WAIT]:
            try:
                self.client(inst).cancel()
            except RunTimeout:
                raise
            except TracrError:
                self.current.pop(inst, None)


def play(state: RunState) -> None:
    """Run the manifest's playbook (see :class:`Playbook`)."""
    Playbook(state).run()
