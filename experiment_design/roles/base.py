"""The participant service base class every role subclasses.

A role is an rpyc service: only ``exposed_`` members are reachable, and each
is decorated with :func:`~experiment_design.runtime.control.control`, which
decodes its JSON argument into a message of :mod:`experiment_design.protocol`
and encodes its reply as JSON (rpyc would pass lists and dicts by reference).
The observer drives it: hello, setup, connect_partners, warmup,
start_task / poll, shutdown. Roles extend it through plain hooks
(``on_setup``, ``on_connect_partners``, ``data_address``, ``probe_link``,
``warmup``, ``prepare_partitioner``), never by overriding an exposed method.

The split engine and the transport load torch, so they are imported inside the hooks
that use them: the observer imports the roles to check a manifest, and ``tracr`` starts
without torch.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, ClassVar

import rpyc

from experiment_design.errors import TracrError
from experiment_design.protocol import (
    ACK,
    BYE,
    Admission,
    ConfigRecord,
    DataAddress,
    Environment,
    GraphPlan,
    InferenceRecord,
    LayerRecord,
    LinkProbe,
    Measurements,
    PartitionerPlan,
    PollReply,
    PollRequest,
    ProfileParams,
    SetupConfig,
    SetupInfo,
    StageRecord,
    TaskStart,
    TaskStarted,
    Warmup,
    WarmupDone,
    Wiring,
)
from experiment_design.roles.inputs import example_of, preload_inputs
from experiment_design.roles.profiling import profile_split_model
from experiment_design.runtime import heap
from experiment_design.runtime.control import control
from experiment_design.runtime.environment import describe
from experiment_design.runtime.sampler import start_sampler
from experiment_design.tasks import create_task

log = logging.getLogger(__name__)

#: how long the next task waits for a finished task's thread to end (its state is already
#: out; what is left is the thread's own exit)
TASK_EXIT_S = 5.0


class ParticipantService(rpyc.Service):
    """Base of all roles: model set-up, task runner, outbox of records, logs, lifecycle.

    ``partners`` maps a partner slot to the registered role a partner must be
    (or subclass); the observer wires partners by role, never by instance name.

    Example::

        from experiment_design.roles import ParticipantService, register_role
        from experiment_design.runtime.control import control

        @register_role("echo")
        class EchoRole(ParticipantService):
            '''Answers ping() with the number of layers of its model.'''

            partners = {}

            @control()
            def exposed_ping(self) -> dict:
                return {"layers": len(self.split_model.layers)}

    ``@control`` beats the heartbeat, decodes the argument (``@control(SomeMessage)``),
    encodes the reply as JSON and turns any failure into one ``TracrError`` naming
    this participant.
    """

    role_name: ClassVar[str] = ""
    partners: ClassVar[dict[str, str]] = {}
    needs_dataset: ClassVar[bool] = False
    #: The side of every cut this role computes ("prefix" or "suffix"); its code is
    #: built at set-up so no inference pays for it (see ``SplitModel.prepare``).
    side: ClassVar[str | None] = None

    def __init__(
        self,
        *,
        instance: str = "",
        threads: int | None = None,
        logs: Any = None,
        on_exit: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__()
        self.instance = instance
        self.threads = threads
        self.logs = logs
        self.on_exit = on_exit
        self.config = SetupConfig()
        self.split_model: Any = None
        self.inputs: list[tuple[Any, Any, str]] = []
        self.device: Any = "cpu"
        self.codec: Any = None
        self.data_secret: bytes = b""
        self.last_call = time.monotonic()
        self.finish_event = threading.Event()
        self.stop_event = threading.Event()
        self.cancel_event = threading.Event()
        self._lock = threading.Lock()
        self.setup_info: SetupInfo | None = None
        self._records: list[InferenceRecord] = []
        self._layers: list[LayerRecord] = []
        self._stages: list[StageRecord] = []
        self._configs: list[ConfigRecord] = []
        self._task_thread: threading.Thread | None = None
        self._state = "idle"
        self._task_name: str | None = None
        self._error: str | None = None
        self._done = 0
        self._total: int | None = None
        self._split: int | None = None
        self._changed = threading.Condition(self._lock)
        self._connections = 0
        self._inflight = 0
        self.sampler: Any = None  # runtime/sampler.py, started at set-up

    # ----- lifecycle --------------------------------------------------------------------------
    def on_connect(self, conn: Any) -> None:
        """Count control connections (the watchdog exits when the observer's closes)."""
        with self._lock:
            self._connections += 1
        self.touch()

    def on_disconnect(self, conn: Any) -> None:
        """The observer went away: stop this participant."""
        with self._lock:
            self._connections -= 1
            last = self._connections <= 0
        if last and self.on_exit:
            self.on_exit("observer connection closed")

    def touch(self) -> None:
        """Record that the observer is alive (watchdog)."""
        self.last_call = time.monotonic()

    def close(self) -> None:
        """Release sockets and threads; subclasses extend."""
        self.stop_event.set()
        self.finish_event.set()
        if self.sampler is not None:
            self.sampler.stop()

    # ----- records ----------------------------------------------------------------------------
    def emit_record(self, row: InferenceRecord, layers: list[LayerRecord] = ()) -> None:
        """Queue one inference row (and its per-layer rows) for the next poll."""
        with self._lock:
            self._records.append(row)
            self._layers.extend(layers)

    def emit_stages(self, rows: list[StageRecord]) -> None:
        """Queue per-stage rows of one inference of a chain (``stages.csv``)."""
        with self._lock:
            self._stages.extend(rows)

    def emit_config(self, row: ConfigRecord) -> None:
        """Queue the summary of one measured configuration of a chain (``configs.csv``)."""
        with self._lock:
            self._configs.append(row)

    def progress(self, done: int | None = None, total: int | None = None, split: int | None = None):
        """Update what poll() reports."""
        with self._lock:
            if done is not None:
                self._done = done
            if total is not None:
                self._total = total
            if split is not None:
                self._split = split

    # ----- set-up -----------------------------------------------------------------------------
    def on_setup(self, config: SetupConfig) -> SetupInfo:
        """Build the model (and dataset if the role needs one); return model facts."""
        import torch

        from experiment_design.split import build_split_model

        threads = config.threads or self.threads
        if threads:
            torch.set_num_threads(int(threads))
            self.threads = int(threads)
        model = config.model
        seed = int(config.seed)
        torch.manual_seed(seed)
        self.split_model = build_split_model(
            model.name,
            seed=seed,
            weights=model.weights,
            depth=model.depth,
            mode=model.mode or "auto",
            batch=int(model.batch or 1),
        )
        self.device = self._place_model(config)
        prepared = {"side": self.side, "splits": 0, "ms": 0.0}
        if self.side:
            t0 = time.perf_counter()
            prepared["splits"] = self.split_model.prepare(self.side)
            prepared["ms"] = round((time.perf_counter() - t0) * 1e3, 1)
            log.info("built %s code for %d cuts in %.0f ms", self.side, prepared["splits"],
                     prepared["ms"])
        if self.needs_dataset and config.dataset:
            self.inputs = [(x.to(self.device), label, item)
                           for x, label, item in preload_inputs(config)]
        self.codec = codec_of(config)
        self.data_secret = bytes.fromhex(config.data_secret)
        sm = self.split_model
        from experiment_design.split.fingerprint import graph_digest, graph_nodes

        nodes = graph_nodes(sm)
        return SetupInfo(
            graph=graph_digest(sm.mode, nodes),
            graph_nodes=nodes,
            mode=sm.mode,
            n_layers=len(sm.layers),
            valid_splits=sm.valid_splits(),
            points=[_plain(p) for p in sm.points],
            profile=sm.profile(),
            inputs=len(self.inputs),
            threads=torch.get_num_threads(),
            device=str(self.device),
            prepared=prepared,
        )

    def _place_model(self, config: SetupConfig) -> Any:
        """Move the model to ``settings.device`` (cpu default; cuda / auto where available)."""
        want = str((config.settings or {}).get("device") or config.device or "cpu")
        try:
            return self.split_model.to(want).device
        except TracrError as exc:
            raise TracrError(f"{self.instance}: {exc}", hint=exc.hint) from None

    # ----- exposed API (one JSON document in, one out; see experiment_design.protocol) --------
    @control()
    def exposed_hello(self) -> Environment:
        """Environment: versions, host, device, CPU, threads, pid, role."""
        return Environment.from_dict(
            {**describe(self.threads), "role": self.role_name, "instance": self.instance})

    @control(SetupConfig)
    def exposed_setup(self, config: SetupConfig) -> SetupInfo:
        """Configure the model, dataset, transport and secrets for this run."""
        self.config = config
        self.instance = config.instance or self.instance
        self.setup_info = self.on_setup(config)
        # the model, its code and the inputs live for the whole run: no collection
        # should walk them again (see runtime/heap.py)
        found = heap.settle()
        if found:
            # an internal figure: in the participant's log at --debug, not on the console
            log.debug("heap settled: %d objects frozen, %d left to the collector (collect "
                     "%.0f ms)", found["frozen"], found["tracked"], found["collect_ms"])
        if self.sampler is not None:
            self.sampler.stop()
        self.sampler = start_sampler(config.settings or {}, self.device)
        return self.setup_info

    @control(GraphPlan)
    def exposed_check_graph(self, plan: GraphPlan) -> str:
        """Refuse a plan whose graph is not this participant's (see ``split/fingerprint``)."""
        import torch

        from experiment_design.split.fingerprint import check_graph

        info = self.setup_info
        if info is None or not info.graph:
            raise TracrError(f"{self.instance}: check_graph() before setup()")
        check_graph(self.instance, torch.__version__, info.graph, info.graph_nodes or [], plan)
        return ACK

    @control()
    def exposed_data_address(self) -> DataAddress | None:
        """Where partners reach this participant's data server, or null."""
        return self.data_address()

    def data_address(self) -> DataAddress | None:
        """Role hook: this participant's data server, if it has one."""
        return None

    @control(Wiring)
    def exposed_connect_partners(self, wiring: Wiring) -> dict:
        """Connect to partners: ``{slot: [{"instance", "host", "port"}, ...]}``."""
        return self.on_connect_partners(wiring)

    def on_connect_partners(self, wiring: Wiring) -> dict:
        """Role hook: open data channels to the partners ``wiring`` names, by slot."""
        return {}

    @control(Admission)
    def exposed_admit_partners(self, admission: Admission) -> dict:
        """Let only these partners into the data server (names, addresses, link keys)."""
        return self.on_admit_partners(admission)

    def on_admit_partners(self, admission: Admission) -> dict:
        """Role hook: admit partners to this participant's data server (none here)."""
        return {}

    @control(ProfileParams)
    def exposed_profile_layers(self, params: ProfileParams) -> dict:
        """This participant's start-up profile (see :func:`profiling.profile_split_model`):
        per-layer medians and minimums of timed full passes, plus the wall and CPU time of
        untimed full passes and the CPU quota this process runs under."""
        x = self.inputs[0][0] if self.inputs else example_of(self.config).to(self.device)
        repeats = int(params.repeats)
        return profile_split_model(
            self.split_model, x, repeats=repeats, warmup=int(params.warmup),
            full_repeats=int(params.full_repeats if params.full_repeats is not None else repeats),
            cold_repeats=int(params.cold_repeats if params.cold_repeats is not None else repeats),
            cold_gap_ms=params.cold_gap_ms, device=str(self.device), quota=params.cpu_quota)

    @control(LinkProbe)
    def exposed_probe_link(self, params: LinkProbe) -> dict | None:
        """Measure the link to the downstream partner (edge roles; null elsewhere)."""
        return self.probe_link(params)

    def probe_link(self, params: LinkProbe) -> dict | None:
        """Role hook: bandwidth and RTT to the downstream partner (``params``: the payload
        size and round trips, unset for the role's defaults)."""
        return None

    @control(Warmup)
    def exposed_warmup(self, req: Warmup) -> WarmupDone:
        """Unrecorded warm-up work; returns ``{"seconds"}``."""
        t0 = time.perf_counter()
        self.warmup(int(req.rounds))
        heap.settle()  # what the start-up probes and the warm-up left, before measuring
        return WarmupDone(seconds=time.perf_counter() - t0)

    def warmup(self, n: int) -> None:
        """Role hook: run ``n`` warm-up passes (not recorded)."""

    @control(Measurements)
    def exposed_prepare_partitioner(self, measured: Measurements) -> PartitionerPlan | None:
        """Give the partitioner its context (edge roles; null elsewhere)."""
        return self.prepare_partitioner(measured)

    def prepare_partitioner(self, measured: Measurements) -> PartitionerPlan | None:
        """Role hook: set up this role's partitioner from the observer's measurements."""
        return None

    @control(TaskStart)
    def exposed_start_task(self, spec: TaskStart) -> TaskStarted:
        """Start ``{"task": name, "params": {...}}`` in a background thread."""
        with self._lock:
            thread, running = self._task_thread, self._state == "running"
        if thread is not None and thread.is_alive():
            if not running:  # its state is out: the thread is only ending (a poll that
                thread.join(TASK_EXIT_S)  # saw "done" can start the next one at once)
            if thread.is_alive():
                raise TracrError(f"{self.instance}: task '{self._task_name}' is still running")
        task = create_task(spec.task, **spec.params)
        heap.settle()  # collected here, not inside the task's first measurements
        with self._lock:
            self._state, self._task_name, self._error = "running", spec.task, None
            self._done, self._total = 0, None
        self._task_thread = threading.Thread(
            target=self._run_task, args=(task,), name=f"task-{spec.task}", daemon=True
        )
        self._task_thread.start()
        return TaskStarted(started=spec.task)

    def _run_task(self, task: Any) -> None:
        try:
            task.run(self)
            state, error = "done", None
            if heap.active():
                gcs = heap.WATCH.totals()
                log.debug("garbage collections since set-up (generations 0/1/2): %s, %s ms, "
                         "longest %.1f ms", "/".join(map(str, gcs["collections"])),
                         "/".join(f"{v:.1f}" for v in gcs["ms"]), gcs["longest_ms"])
        except Exception as exc:  # reported through poll(), never lost
            log.error("task %s failed: %s", task.name, exc)
            log.debug("%s", traceback.format_exc())
            state, error = "failed", f"{type(exc).__name__}: {exc}"
        if self.sampler is not None:  # the machine's speed at the task's end, off its clock
            self.sampler.reference("task-end")
        with self._changed:
            self._state, self._error = state, error
            self._changed.notify_all()

    @control(PollRequest)
    def exposed_poll(self, req: PollRequest) -> PollReply:
        """New records, layer rows and logs since the last poll, plus task state.

        ``{"wait_s": s}`` blocks up to s seconds unless the task state changes,
        so the observer learns of completion at once without busy polling.
        """
        wait_s = float(req.wait_s)
        with self._changed:
            if wait_s > 0 and self._state == "running":
                self._changed.wait(wait_s)
            out = PollReply(state=self._state, task=self._task_name, done=self._done,
                            total=self._total, split=self._split, records=self._records,
                            layers=self._layers, stages=self._stages,
                            configs=self._configs, error=self._error)
            self._records, self._layers, self._stages, self._configs = [], [], [], []
        if out.finished:
            out.decision = self.final_decision()
        out.logs = self.logs.drain() if self.logs is not None else []
        if self.sampler is not None:
            out.metrics, out.metrics_info = self.sampler.drain(), self.sampler.info()
        return out

    def final_decision(self) -> dict | None:
        """The prepared partitioner's decision as plain JSON (None without one)."""
        part = getattr(self, "partitioner", None)
        if part is None or part.ctx is None:
            return None
        return json.loads(json.dumps(part.decision(), default=str))

    @control()
    def exposed_finish(self) -> str:
        """End a running ``wait`` task (the observer's "finish")."""
        self.finish_event.set()
        return ACK

    @control()
    def exposed_cancel(self) -> str:
        """Ask the running task to stop at its next step (the run is being aborted)."""
        self.cancel_event.set()
        self.finish_event.set()
        return ACK

    @control()
    def exposed_heartbeat(self) -> str:
        """Keep the watchdog quiet."""
        return ACK

    @control()
    def exposed_shutdown(self) -> str:
        """Stop this participant shortly after replying."""
        self.close()
        if self.on_exit:
            threading.Timer(0.05, self.on_exit, args=("shutdown requested",)).start()
        return BYE

    def busy(self) -> bool:
        """True while a (possibly long) observer call is being served."""
        return self._inflight > 0

    def begin_call(self) -> None:
        """An observer call starts (the idle watchdog waits while any is in progress)."""
        with self._lock:
            self._inflight += 1

    def end_call(self) -> None:
        """An observer call ended."""
        with self._lock:
            self._inflight -= 1


def codec_of(config: SetupConfig) -> Any:
    """The :class:`~experiment_design.transport.CodecConfig` of ``config.transport``
    (the defaults without one); it checks every value."""
    from experiment_design.transport import CodecConfig  # loads torch: see the module docstring

    return CodecConfig.from_dict(config.transport.to_dict() if config.transport else {})


def _plain(obj: Any) -> Any:
    """A dataclass (SplitPoint, LayerInfo) as a JSON-able dict."""
    import dataclasses

    if dataclasses.is_dataclass(obj):
        return {k: _plain(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, (tuple, list)):
        return [_plain(v) for v in obj]
    return obj
