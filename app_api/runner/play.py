"""Play phase: run each participant's playbook, stream its records, stop early on a loss."""

from __future__ import annotations

import time
from typing import Any

from app_api.runner.state import RunState
from experiment_design.errors import TracrError
from experiment_design.protocol import PollReply, TaskStart

POLL_S = 0.25
HEARTBEAT_S = 5.0
WAIT = "wait"  # the task a serving participant (the cloud) runs until released


class Playbook:
    """The playbook's progress across participants: whose task runs, how far each got.

    :meth:`run` polls every participant with a running task, streams what it
    reports into the run directory, starts its next task when one ends, and on
    a failure, a lost participant or a stop request cancels the rest and
    releases the participants that only serve others.
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
        self.cancelled = False
        self.dead: set[str] = set()

    def run(self) -> None:
        """Play until every participant's queue is empty (or the run is aborted)."""
        view = self.state.view
        view.start(self.planned)
        last_beat = time.monotonic()
        for inst in list(self.queues):
            self.start_next(inst)
        while self.current:
            if self.state.stop_requested and not self.aborting:
                self.abort("interrupted")
            self.poll_all()
            total = sum(t for t in self.totals.values() if t) or self.planned
            view.update(sum(self.done.values()), total,
                        next(iter(self.split_now.values()), None) if self.split_now else None)
            self.check_alive()
            self.release_servers()
            if self.aborting and not self.cancelled:
                self.cancel_running()
            if time.monotonic() - last_beat > HEARTBEAT_S:
                last_beat = time.monotonic()
                self.heartbeat_idle()
        view.stop()

    def abort(self, error: str) -> None:
        """Record why, and stop starting tasks."""
        self.state.errors.append(error)
        self.aborting = True

    def start_next(self, inst: str) -> None:
        """Start ``inst``'s next task, or mark it idle when its queue is empty."""
        if self.queues[inst]:
            task = self.queues[inst].pop(0)
            self.current[inst] = task["task"]
            self.state.client(inst).start_task(
                TaskStart(task=task["task"], params=task.get("params") or {}))
        else:
            self.current.pop(inst, None)

    def poll_all(self) -> None:
        """One poll of every participant with a task; the busy ones share POLL_S of waiting."""
        busy = [i for i, t in self.current.items() if t != WAIT]
        for inst in list(self.current):
            wait_s = POLL_S / max(1, len(busy)) if inst in busy else 0.0
            try:
                st = self.state.client(inst).poll(wait_s)
            except TracrError as exc:
                self.abort(str(exc) + (f"\n{exc.hint}" if exc.hint else ""))
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
        for r in st.layers:
            r["instance"] = inst
        self.state.writer.add_inferences(st.records)
        self.state.writer.add_layers(st.layers)
        for rec in st.logs:
            self.state.view.log(inst, host, rec)

    def check_alive(self) -> None:
        """A participant whose process ended is reported once and ends the run."""
        for inst, h in self.state.handles.items():
            if not h.alive() and inst not in self.dead:
                self.dead.add(inst)
                self.abort(f"participant {inst} on {h.host_label} died (pid {h.pid})")
                self.current.pop(inst, None)

    def release_servers(self) -> None:
        """Release the serving participants once nothing else runs (or the run aborts)."""
        waiting = [i for i, t in self.current.items() if t == WAIT]
        if waiting and (self.aborting or len(waiting) == len(self.current)):
            for inst in waiting:
                try:
                    self.state.client(inst).finish()
                except TracrError as exc:
                    self.state.errors.append(str(exc))
                    self.current.pop(inst, None)

    def cancel_running(self) -> None:
        """Cancel every running task once (the rows measured so far are kept)."""
        self.cancelled = True
        for inst in [i for i, t in self.current.items() if t != WAIT]:
            try:
                self.state.client(inst).cancel()
            except TracrError:
                self.current.pop(inst, None)

    def heartbeat_idle(self) -> None:
        """Participants without a task get no polls: keep their idle watchdogs fed."""
        for inst, h in self.state.handles.items():
            if inst not in self.current and h.alive():
                try:
                    self.state.client(inst).heartbeat()
                except TracrError:
                    pass


def play(state: RunState) -> None:
    """Run the manifest's playbook (see :class:`Playbook`)."""
    Playbook(state).run()
