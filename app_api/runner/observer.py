"""The observer: deploy participants, wire them by role, warm up, run the playbook, tear down."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app_api.launch import ParticipantHandle, ParticipantSpec, launcher_for
from app_api.runner.client import ParticipantClient, ParticipantLost
from app_api.runner.facts import LabFacts
from app_api.runner.progress import ProgressView
from app_api.units import parse_rate
from experiment_design.errors import TracrError
from experiment_design.protocol import (
    LinkProbe,
    Measurements,
    PartnerAddress,
    PollReply,
    ProfileParams,
    SetupConfig,
    SetupInfo,
    TaskStart,
    Wiring,
    partition_context,
)

log = logging.getLogger(__name__)
POLL_S = 0.25
HEARTBEAT_S = 5.0
# start-up profile: per-layer medians of timed passes + the median of untimed full passes
# (the calibration partitioners scale the layer times to; see partitioners/predicted.py)
PROFILE_PARAMS = ProfileParams(repeats=7, full_repeats=9)


class Interrupted(BaseException):
    """SIGTERM, turned into an exception so the teardown in ``finally`` runs."""


@dataclass
class RunResult:
    """What a run produced: its directory, summary and whether every inference succeeded."""

    run_dir: Path
    summary: dict
    ok: bool
    errors: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 ok, 1 some inference failed or a participant died."""
        return 0 if self.ok else 1


class Observer:
    """Runs one manifest. Use :func:`run_experiment`."""

    def __init__(self, manifest: Any, out_dir: str | os.PathLike | None = None,
                 progress: bool = True, facts: LabFacts | None = None) -> None:
        from app_api.results import RunWriter

        self.m = manifest
        self.view = ProgressView(progress, title=manifest.name)
        self.writer = RunWriter(manifest.name, out_dir)
        self.handles: dict[str, ParticipantHandle] = {}
        # owns every launched participant: teardown's one exit path closes them all
        self.owned = contextlib.ExitStack()
        self._owning = threading.Lock()
        self.roles: dict[str, str] = {}
        self.envs: dict[str, dict] = {}
        self.infos: dict[str, SetupInfo] = {}
        self.errors: list[str] = []
        self.times: dict[str, float] = {}
        self.extra: dict[str, Any] = {}
        self.facts = facts or LabFacts()
        lab_link = self.facts.link_report()
        if lab_link:
            # the lab link, as configured and as measured when it was (re)shaped
            self.extra["network"] = {"lab": lab_link}
        self.pairs: list[tuple[str, str]] = []
        self.partitioners: dict[str, dict | None] = {}
        self._reported_dead: set[str] = set()
        self.phase = "init"
        self.eval_ctx: dict | None = None
        self.stop_requested = False

    # ----- calls ------------------------------------------------------------------------------
    def client(self, inst: str) -> ParticipantClient:
        """The typed control client of participant ``inst`` (errors name it and its host)."""
        return ParticipantClient(inst, self.handles[inst])

    def parallel(self, fn, items: list) -> list:
        """fn over items on threads (one per participant); first error re-raised."""
        if len(items) <= 1:
            return [fn(i) for i in items]
        with ThreadPoolExecutor(max_workers=len(items)) as ex:
            futs = [ex.submit(fn, i) for i in items]
            errs, out = [], []
            for f in futs:
                try:
                    out.append(f.result())
                except BaseException as exc:  # collect all, raise the first
                    errs.append(exc)
                    out.append(None)
            if errs:
                raise errs[0]
            return out

    # ----- phases -----------------------------------------------------------------------------
    def deploy(self) -> None:
        """Start every participant, handshake, set up, wire partners."""
        from experiment_design.roles import get_role

        m = self.m
        specs = []
        for inst in m.participant_instances:
            ptype = m.participant_types[inst["type"]]
            settings = ptype.get("settings") or {}
            get_role(ptype["role"])  # unknown roles fail before any process starts
            threads = settings.get("threads")
            if threads is None and inst["device"] == "localhost":
                threads = 1
            specs.append(ParticipantSpec(inst["name"], ptype["role"], inst["device"], threads,
                                         os.urandom(32)))
            self.roles[inst["name"]] = ptype["role"]
        self.view.phase(f"deploying {len(specs)} participants: "
                        + ", ".join(f"{s.instance} ({s.role} on {s.device})" for s in specs))

        def start(spec: ParticipantSpec) -> None:
            handle = launcher_for(spec.device).start(spec)
            with self._owning:
                self.owned.enter_context(handle)
                self.handles[spec.instance] = handle

        t0 = time.perf_counter()
        self.parallel(start, specs)
        self.times["start_s"] = time.perf_counter() - t0
        from app_api.runner.compat import check_environments

        for s in specs:
            env = self.client(s.instance).hello().to_dict()
            env.update(device_name=s.device, host_label=self.handles[s.instance].host_label)
            self.envs[s.instance] = env
        self.extra["warnings"] = check_environments(self.envs)
        data_secret = os.urandom(32).hex()

        def setup(spec: ParticipantSpec) -> None:
            self.infos[spec.instance] = self.client(spec.instance).setup(
                self.participant_config(spec, data_secret))

        t0 = time.perf_counter()
        self.parallel(setup, specs)
        self.times["setup_s"] = time.perf_counter() - t0
        for inst, info in self.infos.items():  # which cuts each side built before measuring
            self.envs[inst]["prepared"] = info.prepared
        self.wire()

    def participant_config(self, spec: ParticipantSpec, data_secret: str) -> SetupConfig:
        """The set-up of one participant."""
        m = self.m
        inst = next(i for i in m.participant_instances if i["name"] == spec.instance)
        ptype = m.participant_types[inst["type"]]
        settings = dict(ptype.get("settings") or {})
        model = dict(m.model)
        override = ptype.get("model")
        if isinstance(override, str):
            model["name"] = override
        elif isinstance(override, dict):
            model.update(override)
        return SetupConfig(
            instance=spec.instance,
            model=model,
            seed=int((m.run or {}).get("seed", 0) or 0),
            dataset=m.dataset,
            transport=m.transport,
            partitioner=m.partitioner,
            run=dict(m.run or {}),
            data_secret=data_secret,
            threads=spec.threads,
            data_bind=settings.get("data_bind") or self._default_bind(spec),
            settings=settings,
        )

    def _default_bind(self, spec: ParticipantSpec) -> str:
        """Loopback on localhost; on a device, the address its partners use (if an IP)."""
        import ipaddress

        if spec.device == "localhost":
            return "127.0.0.1"
        host = getattr(self.handles.get(spec.instance), "data_host", None) or ""
        try:
            ipaddress.ip_address(host)
            return host
        except ValueError:
            return "0.0.0.0"  # a host name: listen everywhere; the data path is authenticated

    def wire(self) -> None:
        """Connect each participant to the partners its role declares, matched by role."""
        from experiment_design.roles import get_role, role_is

        for inst, role in self.roles.items():
            cls = get_role(role)
            wiring = Wiring()
            for slot, want in cls.partners.items():
                peers = [p for p, r in self.roles.items() if p != inst and role_is(get_role(r), want)]
                if not peers:
                    raise TracrError(
                        f"{inst} (role {role}) needs a '{want}' partner for '{slot}', and the "
                        "manifest has none.",
                        hint=f"add a participant instance whose role is {want} (or a subclass)",
                    )
                wiring.partners[slot] = []
                for p in peers:
                    addr = self.client(p).data_address()
                    if addr is None:
                        raise TracrError(f"{p} (role {self.roles[p]}) has no data server")
                    host = addr.host
                    far = self.handles[p].device != self.handles[inst].device
                    if host in ("0.0.0.0", "::") or (far and host in ("127.0.0.1", "::1")):
                        host = self.handles[p].data_host or "127.0.0.1"
                    wiring.partners[slot].append(PartnerAddress(instance=p, host=host,
                                                                port=addr.port))
                    self.pairs.append((inst, p))
            if wiring.partners:
                from app_api.runner.compat import check_plans

                check_plans(self.infos, self.pairs)
                self.client(inst).connect_partners(wiring)

    def warmup(self) -> None:
        """Unrecorded warm-up passes, then the partitioner's measurements and set-up."""
        n = int((self.m.run or {}).get("warmup", 2) or 0)
        self.view.phase(f"warm-up ({n} round trips per end split, not recorded)")
        for inst in self.handles:
            self.client(inst).warmup(n)
        evaluate = list(((self.m.evaluate or {}).get("partitioners")) or [])
        for inst, info in self.infos.items():
            if info.partitioner_needs is None:
                continue
            needs = set(info.partitioner_needs)
            if evaluate and self.eval_ctx is None:
                # scoring other partitioners afterwards needs the same start-up measurements
                needs |= {"edge_profile", "cloud_profile", "network"}
            ctx = Measurements()
            partners = [b for a, b in self.pairs if a == inst]
            if "edge_profile" in needs:
                from experiment_design.roles.profiling import cold_gap_for

                lab_quota = self.facts.cpu_quota(self.handles[inst].device)
                params = PROFILE_PARAMS
                if lab_quota:  # the edge cannot see the lab's period: size its cold-pass gaps here
                    params = dataclasses.replace(
                        params, cold_gap_ms=cold_gap_for(lab_quota["period_ms"]))
                ctx.edge_profile = _with_quota(self.client(inst).profile_layers(params), lab_quota)
            if "cloud_profile" in needs and partners:
                ctx.cloud_profile = self.client(partners[0]).profile_layers(PROFILE_PARAMS)
            if partners:
                # always measured (cheap, raw payloads): the link figure belongs in every summary
                net = self.client(inst).probe_link(LinkProbe())
                self.extra.setdefault("network", {})[inst] = {
                    k: v for k, v in (net or {}).items() if k != "samples"}
                if "network" in needs:
                    ctx.network = net
            if "measured" in needs:
                ctx.measured = (self.m.partitioner.get("params") or {}).get("measured")
            plan = self.client(inst).prepare_partitioner(ctx)
            self.partitioners[inst] = None if plan is None else plan.to_dict()
            if evaluate and self.eval_ctx is None:
                self.eval_ctx = partition_context(info, ctx)
        self.extra["partitioner"] = self.partitioners

    def play(self) -> None:
        """Run each instance's playbook; stream records; stop early on a lost participant."""
        queues = {inst: list(self.m.playbook.get(inst, [])) for inst in self.handles}
        current: dict[str, str] = {}
        totals = {i: (p or {}).get("sweep_length") for i, p in self.partitioners.items()}
        done_counts: dict[str, int] = {}
        finished = {inst: (0, 0) for inst in queues}  # (done, total) of completed tasks
        split_now: dict[str, Any] = {}
        planned = sum(t for t in totals.values() if t) or None
        self.view.start(planned)
        last_beat = time.monotonic()

        def start_next(inst: str) -> None:
            if queues[inst]:
                task = queues[inst].pop(0)
                current[inst] = task["task"]
                self.client(inst).start_task(
                    TaskStart(task=task["task"], params=task.get("params") or {}))
            else:
                current.pop(inst, None)

        for inst in list(queues):
            start_next(inst)
        aborting = cancelled = False
        while current:
            if self.stop_requested and not aborting:
                self.errors.append("interrupted")
                aborting = True
            busy = [i for i, t in current.items() if t != "wait"]
            for inst in list(current):
                h = self.handles[inst]
                wait_s = POLL_S / max(1, len(busy)) if inst in busy else 0.0
                try:
                    st = self.client(inst).poll(wait_s)
                except TracrError as exc:
                    self.errors.append(str(exc) + (f"\n{exc.hint}" if exc.hint else ""))
                    current.pop(inst, None)
                    aborting = True
                    continue
                self.ingest(inst, h, st)
                if current.get(inst) != "wait":
                    totals[inst] = finished[inst][1] + (st.total or 0) \
                        if st.total is not None else totals.get(inst)
                    done_counts[inst] = finished[inst][0] + (st.done or 0)
                if st.split is not None:
                    split_now[inst] = st.split
                if st.finished:
                    finished[inst] = (done_counts.get(inst, 0), totals.get(inst) or 0)
                if st.state == "failed":
                    self.errors.append(f"{inst}: task {st.task} failed: {st.error}")
                    current.pop(inst, None)
                    aborting = True
                elif st.state == "done" and not aborting:
                    start_next(inst)
                elif st.state == "done":
                    current.pop(inst, None)
            total = sum(t for t in totals.values() if t) or planned
            self.view.update(sum(done_counts.values()), total,
                             next(iter(split_now.values()), None) if split_now else None)
            for inst, h in self.handles.items():
                if not h.alive() and inst not in self._reported_dead:
                    self._reported_dead.add(inst)
                    self.errors.append(f"participant {inst} on {h.host_label} died "
                                       f"(pid {h.pid})")
                    current.pop(inst, None)
                    aborting = True
            waiting = [i for i, t in current.items() if t == "wait"]
            if waiting and (aborting or len(waiting) == len(current)):
                for inst in waiting:
                    try:
                        self.client(inst).finish()
                    except TracrError as exc:
                        self.errors.append(str(exc))
                        current.pop(inst, None)
            if aborting and not cancelled:
                cancelled = True
                for inst in [i for i, t in current.items() if t != "wait"]:
                    try:
                        self.client(inst).cancel()
                    except TracrError:
                        current.pop(inst, None)
            if time.monotonic() - last_beat > HEARTBEAT_S:
                last_beat = time.monotonic()
                for inst in self.handles:
                    if inst not in current and self.handles[inst].alive():
                        try:
                            self.client(inst).heartbeat()
                        except TracrError:
                            pass
        self.view.stop()

    def ingest(self, inst: str, h: ParticipantHandle, st: PollReply) -> None:
        """Stream a poll's records and logs into the run directory and the view."""
        for r in st.records:
            r["instance"], r["host"] = inst, h.host_label
        for r in st.layers:
            r["instance"] = inst
        self.writer.add_inferences(st.records)
        self.writer.add_layers(st.layers)
        for rec in st.logs:
            self.view.log(inst, h.host_label, rec)

    def teardown(self) -> None:
        """Shut every participant down and make sure nothing is left running."""
        for inst, h in list(self.handles.items()):
            if h.alive() and h.conn is not None:
                try:
                    self.client(inst).shutdown()
                except Exception:  # already gone: stop() below cleans up
                    pass

        def stop(h: ParticipantHandle) -> None:
            h.stop(timeout=10.0)

        with self.owned:  # stopped in parallel (fast); the stack closes any the pool missed
            self.parallel(stop, list(self.handles.values()))
        left = [f"{i}: {x}" for i, h in self.handles.items() for x in h.leftovers()]
        if left:
            self.errors.append("left behind after teardown: " + ", ".join(left))

    # ----- the whole run ----------------------------------------------------------------------
    def run(self) -> RunResult:
        """Deploy, warm up, play, tear down (always), write results."""
        w = self.writer
        w.write_text("manifest.yaml", self.m.to_yaml())
        w.write_json("overrides.json", list(self.m.overrides or []))
        interrupted = False
        fatal: BaseException | None = None
        old = _install_signals(self)
        t0 = time.perf_counter()
        try:
            self.phase = "deploy"
            self.deploy()
            self.times["deploy_s"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            self.phase = "warmup"
            self.warmup()
            self.times["warmup_s"] = time.perf_counter() - t1
            self.view.phase("running the playbook")
            t2 = time.perf_counter()
            self.phase = "play"
            self.play()
            self.times["wall_s"] = time.perf_counter() - t2
            if self.stop_requested:
                raise Interrupted("signal")
        except (KeyboardInterrupt, Interrupted):
            interrupted = True
            if "interrupted" not in self.errors:
                self.errors.append("interrupted")
        except TracrError as exc:
            self.errors.append(str(exc) + (f" ({exc.hint})" if exc.hint else ""))
            if not isinstance(exc, ParticipantLost) and not self.writer.rows:
                fatal = exc  # set-up problem (bad config, unreachable device): a user error
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            fatal = exc
        finally:
            self.phase = "teardown"
            self.view.stop()
            t3 = time.perf_counter()
            try:
                self.teardown()
            finally:
                self.times["teardown_s"] = time.perf_counter() - t3
                _restore_signals(old)
        result = self.finish(interrupted=interrupted)
        if fatal is not None:
            raise fatal
        if interrupted:
            raise KeyboardInterrupt
        return result

    def _evaluate(self, summary: dict, run_dir: Path) -> dict | None:
        """Score the manifest's ``evaluate.partitioners`` against this sweep."""
        try:
            from app_api.runner.evaluate import evaluate_run

            return evaluate_run(self.m.evaluate["partitioners"], self.eval_ctx,
                                summary["splits"], run_dir, _bandwidths(self.m.network))
        except Exception as exc:  # scoring must never lose the run's own results
            log.warning("partitioner evaluation failed: %s", exc)
            self.extra.setdefault("warnings", []).append(f"partitioner evaluation failed: {exc}")
            return None

    def finish(self, interrupted: bool) -> RunResult:
        """Write environment.json, summary.json and plots; return the result."""
        from app_api.results import build_summary

        w = self.writer
        w.close()
        w.write_json("environment.json", self.envs)
        model = dict(self.m.model)
        weights = "pretrained" if model.get("weights") else "random"
        failed_rows = [r for r in w.rows if r.get("error")]
        ok = not self.errors and not failed_rows and not interrupted
        summary = build_summary(
            w.rows,
            experiment=self.m.name,
            run_id=w.run_id,
            status="interrupted" if interrupted else ("ok" if ok else "failed"),
            wall_s=self.times.get("wall_s"),
            deploy_s=self.times.get("deploy_s"),
            deploy_phases={k: self.times.get(k) for k in ("start_s", "setup_s")},
            warmup_s=self.times.get("warmup_s"),
            teardown_s=self.times.get("teardown_s"),
            model=model.get("name"),
            weights=weights,
            mode=next((i.mode for i in self.infos.values() if i), None),
            threads={i: e.get("threads") for i, e in self.envs.items()},
            layer_rows=w.n_layers,
            errors=self.errors,
            **self.extra,
        )
        if self.eval_ctx is not None and summary["splits"]:
            summary["partitioners"] = self._evaluate(summary, w.dir)
            from app_api.runner.evaluate import measurement_noise

            summary["measurement_noise"] = measurement_noise(w.rows)
        w.write_json("summary.json", summary)
        try:
            from app_api.results.plots import draw

            draw(summary, w.dir)
        except Exception as exc:  # a plot must never lose a run
            log.warning("plots not drawn: %s", exc)
        return RunResult(run_dir=w.dir, summary=summary, ok=ok, errors=list(self.errors))


def _with_quota(profile: dict | None, quota: dict | None) -> dict | None:
    """Add ``quota`` (the lab's) to a profile that could not read its own."""
    if isinstance(profile, dict) and quota and not profile.get("cpu_quota"):
        profile["cpu_quota"] = quota
    return profile


def _bandwidths(network: dict | None) -> list[float]:
    """The sweep's rates in bytes/s: the partitioners are scored at each of them."""
    return [parse_rate(bw) for bw in (network or {}).get("bandwidths") or []]


def _install_signals(observer: Observer):
    """SIGINT/SIGTERM: raise while deploying (calls there are long), but only set a flag
    while the playbook runs or teardown is going on, so no rpyc exchange is cut in half."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        observer.stop_requested = True
        if observer.phase in ("deploy", "warmup"):
            raise Interrupted(f"signal {signum}")

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def _restore_signals(old) -> None:
    if old and threading.current_thread() is threading.main_thread():
        for sig, h in old.items():
            signal.signal(sig, h)


def run_experiment(manifest: Any, out_dir: str | os.PathLike | None = None,
                   progress: bool = True, facts: LabFacts | None = None) -> RunResult:
    """Run a loaded :class:`app_api.manifest.Manifest` and return its :class:`RunResult`.

    ``facts``: what the lab knows about the hosts (its link report, recorded in
    ``summary.json`` under ``network.lab``, and CPU quotas), gathered by the caller
    (:func:`app_api.runner.network.lab_facts`); None for none.
    """
    return Observer(manifest, out_dir=out_dir, progress=progress, facts=facts).run()
