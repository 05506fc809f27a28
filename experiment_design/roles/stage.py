"""Members of a chain of stages: data channels to the partners, and the serving stage.

:class:`ChainMember` opens one authenticated data channel to each partner it is wired
to (its possible next stages). :class:`StageRole` (role ``stage``) also accepts
channels from the stages before it and serves them with a
:class:`~experiment_design.runtime.chain.ChainServer`: it runs its layers of each
inference and passes the result on, to the next stage or back as the reply. The cloud
is the stage that is last in every route of the edge/cloud pair; the edge is the head.

torch and the transport (which loads torch) are imported inside the methods that use
them, for start-up time: ``tracr experiment validate`` imports the roles and loads no
torch (``tests/unit/test_cli_experiment.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.protocol import (
    HEARTBEAT_S,
    LIVENESS_TIMEOUT_S,
    DataAddress,
    SetupConfig,
    SetupInfo,
    Wiring,
)
from experiment_design.roles.base import ParticipantService
from experiment_design.roles.registry import register_role
from experiment_design.runtime.chain import ChainServer
from experiment_design.runtime.control import control

log = logging.getLogger(__name__)


class ChainMember(ParticipantService):
    """A participant with data channels to its downstream partners (by instance name)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.channels: list[tuple[str, Any]] = []
        self.downstream: dict[str, Any] = {}
        #: the receive deadline of the data channels (``run.liveness_timeout_s``)
        self.liveness_s = LIVENESS_TIMEOUT_S

    def on_connect_partners(self, wiring: Wiring) -> dict:
        """Open one authenticated data channel per partner, whatever its slot."""
        from experiment_design.transport import connect

        # no reply for the liveness timeout: the partner is lost (a receive never waits for
        # ever; a partner profiling or computing sends nothing only between requests)
        run = self.config.run
        deadline = self.liveness_s = float((run.liveness_timeout_s if run else None)
                                           or LIVENESS_TIMEOUT_S)
        for slot_peers in wiring.partners.values():
            for peer in slot_peers:
                if peer.instance in self.downstream:
                    continue
                key = bytes.fromhex(peer.key) if peer.key else None
                ch = connect(peer.host, int(peer.port), self.data_secret or None,
                             self.codec, limits=self.frame_limits(), name=self.instance,
                             partner=peer.instance, key=key)
                ch.set_timeout(deadline, partner=peer.instance)
                self.channels.append((peer.instance, ch))
                self.downstream[peer.instance] = ch
                log.info("connected to %s at %s:%s", peer.instance, peer.host, peer.port)
        return {"channels": [name for name, _ in self.channels]}

    def frame_limits(self) -> Any:
        """What one frame from a partner may declare: at most twice the most this run's
        model puts in a frame (its largest set of crossing tensors, input and output
        included; see :func:`~experiment_design.transport.frame.run_limits`)."""
        from experiment_design.transport.frame import Limits, run_limits

        points = getattr(self.split_model, "points", None)
        if not points:
            return Limits()
        return run_limits(max(p.crossing_bytes for p in points))

    @control()
    def exposed_probe_links(self) -> dict:
        """Bandwidth and RTT to every downstream partner, by ``"this>partner"``."""
        return self.probe_links()

    def probe_links(self) -> dict[str, dict]:
        """Bandwidth and RTT to every downstream partner (each channel's own probe)."""
        out = {}
        for name, ch in self.channels:
            res = ch.probe()
            out[f"{self.instance}>{name}"] = {k: v for k, v in res.items() if k != "samples"}
        return out

    def finish_partners(self) -> None:
        """Tell every downstream partner this participant is done, then close the channels.
        A channel whose replies a relay thread reads gets its goodbye through that thread."""
        chain = getattr(self, "chain", None)
        relays = getattr(chain, "relays", {})
        for name, ch in self.channels:
            try:
                if name in relays:
                    chain.expect(name)  # its relay reads the answer
                ch.send({"op": "finish"}, {})
                if name in relays:
                    relays[name].join(timeout=5.0)
                else:
                    ch.recv()
            except Exception as exc:  # partner already gone: nothing more to say
                log.warning("could not say goodbye to %s: %s", name, exc)
        self.close_channels()

    def close_channels(self) -> None:
        """Close every data channel to a partner."""
        for _, ch in self.channels:
            try:
                ch.close()
            except OSError:
                pass
        self.channels = []
        self.downstream = {}

    def close(self) -> None:
        """Close the data channels too."""
        super().close()
        self.close_channels()


@register_role("stage")
class StageRole(ChainMember):
    """A stage that serves the stages before it: runs its layers of each inference and
    passes the result on (see :mod:`experiment_design.runtime.chain`).

    The reply header of an inference carries every stage's own durations, each measured
    on its own clock.
    """

    partners: dict[str, str] = {}

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.server: Any = None
        self.chain: Any = None
        self._open = 0
        self._accepted: list[Any] = []

    def on_setup(self, config: SetupConfig) -> SetupInfo:
        """Model plus a listening DataServer (bind host from ``data_bind``)."""
        info = super().on_setup(config)
        from experiment_design.transport import DataServer

        depth = int((config.pipeline.queue if config.pipeline else None) or 2)
        self.chain = ChainServer(self, depth=depth)
        bind = config.data_bind or "127.0.0.1"
        # no run secret (the observer's runs): nobody gets in until admit_partners()
        self.server = DataServer(bind, int(config.data_port or 0),
                                 self.data_secret or None, self.codec, name=self.instance,
                                 limits=self.frame_limits())
        threading.Thread(target=self._accept_loop, name="data-accept", daemon=True).start()
        info.data_address = list(self.server.address)
        return info

    def data_address(self) -> DataAddress | None:
        """Where partners connect: ``{"host", "port"}``."""
        if self.server is None:
            return None
        host, port = self.server.address[:2]
        return DataAddress(host=host, port=port)

    def on_admit_partners(self, admission: Any) -> dict:
        """Let exactly the partners the observer wired to this stage into its data server,
        each from its own addresses, with its link's key; the server stops listening once
        all of them have connected."""
        from experiment_design.transport import Partner, link_key

        if self.server is None:
            raise TracrError(f"{self.instance}: admit_partners() before setup()")
        partners = []
        for p in admission.partners:
            key = (bytes.fromhex(p.key) if p.key
                   else link_key(self.data_secret, self.instance, p.instance))
            partners.append(Partner(p.instance, key, tuple(p.hosts)))
        self.server.admit(partners)
        return {"admitted": [p.name for p in partners]}

    def _accept_loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                ch = self.server.accept(timeout=None)
            except Exception as exc:  # closed server, or a peer that failed auth
                if self.stop_event.is_set() or self.server.complete:
                    return  # stopped, or every partner is in: nothing more to accept
                log.warning("data accept: %s", exc)
                time.sleep(0.05)
                continue
            if ch is None:
                continue
            with self._lock:
                self._open += 1
                self._accepted.append(ch)
            threading.Thread(target=self._serve, args=(ch,), name="data-serve", daemon=True).start()

    def _serve(self, ch: Any) -> None:
        from experiment_design.transport.errors import TransportError

        try:
            while not self.stop_event.is_set():
                header, tensors, rstats = ch.recv()
                op = header.get("op")
                if op == "finish":
                    ch.send({"op": "bye"}, {})
                    break
                if op == "echo":
                    ch.send({"op": "echo"}, tensors)
                    continue
                if op == "solo":
                    every = float(header.get("progress_s") or HEARTBEAT_S)
                    ch.send(self.solo(int(header.get("count") or 1), tensors,
                                      report=lambda done: ch.send({"op": "progress",
                                                                   "done": done}, {}),
                                      every_s=every), {})
                    continue
                if op != "infer":
                    raise TracrError(f"unknown data op {op!r}")
                self.chain.handle(ch, header, tensors, rstats)
        except (OSError, EOFError, TransportError) as exc:
            if not self.stop_event.is_set():
                log.info("data channel closed: %s", exc)
        finally:
            ch.close()
            with self._lock:
                self._open -= 1
                if ch in self._accepted:
                    self._accepted.remove(ch)
                last = self._open <= 0
            if last:
                if self.channels and not self.stop_event.is_set():
                    self.finish_partners()  # nobody sends any more: pass the goodbye on
                self.finish_event.set()

    def solo(self, count: int, tensors: dict, report: Any = None,
             every_s: float = HEARTBEAT_S) -> dict:
        """The single-device baseline: the whole model ``count`` times on the input sent,
        back to back, on this participant alone.

        ``report(done)`` is called between two passes once ``every_s`` have gone by since
        the start or the last report: the head waits for the result under the link's
        liveness deadline, and a baseline of many passes on a slow host outlasts it (32
        passes of resnet50 on a quarter of a core). Only a single pass longer than the
        deadline is then a lost partner. The reports' time is not counted in the span."""
        import statistics

        import torch

        try:
            (x,) = tensors.values()
            x = x.to(self.device)
            times = []
            aside = 0  # ns spent reporting
            with torch.inference_mode():
                t_first = last = time.perf_counter_ns()
                for i in range(count):
                    t0 = time.perf_counter_ns()
                    self.split_model.run_full(x)
                    t1 = time.perf_counter_ns()
                    times.append((t1 - t0) / 1e6)
                    if report is not None and i < count - 1 and (t1 - last) / 1e9 >= every_s:
                        report(i + 1)
                        last = time.perf_counter_ns()
                        aside += last - t1
                span = (time.perf_counter_ns() - t_first - aside) / 1e9
            return {"op": "solo", "throughput_per_s": count / span,
                    "latency_ms_p50": statistics.median(times)}
        except Exception as exc:  # reported to the head
            return {"op": "solo", "error": f"{type(exc).__name__}: {exc}"}

    def close(self) -> None:
        """Stop accepting, close the server socket and every channel."""
        super().close()
        if self.server is not None:
            try:
                self.server.close()
            except OSError:
                pass
        for ch in list(self._accepted):
            ch.close()


def require_channels(member: ChainMember) -> None:
    """A head with nobody to send to cannot run."""
    if not member.channels:
        raise TracrError(f"{member.instance}: no downstream partner to send to")
