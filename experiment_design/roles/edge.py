"""The edge role: the head of the chain; preloaded inputs, the first layers, the result back."""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.partitioners import PartitionContext, create_partitioner
from experiment_design.partitioners.bandwidth import LinkSample
from experiment_design.partitioners.cyclic import parse_transports
from experiment_design.protocol import (
    InferenceRecord,
    LayerRecord,
    LinkProbe,
    Measurements,
    PartitionerConfig,
    PartitionerPlan,
    SetupConfig,
    SetupInfo,
    Wiring,
)
from experiment_design.roles.chain_probes import ChainProbes, predicted_of
from experiment_design.roles.registry import register_role
from experiment_design.roles.stage import ChainMember, require_channels
from experiment_design.runtime.chain import ChainHead, Completed, Route
from experiment_design.runtime.fidelity import (
    compare,
    probe,
    reference_outputs,
    spread,
    top1s,
    transport_label,
)
from experiment_design.runtime.pipestats import stage_rows, summarize, throughput_per_s

log = logging.getLogger(__name__)


@register_role("edge")
class EdgeRole(ChainMember, ChainProbes):
    """The head of the chain: runs the first layers on its own inputs and ships what
    crosses the cut (see :mod:`experiment_design.runtime.chain`).

    One row per inference, all durations on this host's clock except the other stages'
    own decode/compute durations, which they measure and report in the reply.
    """

    partners = {"downstream": "cloud"}
    needs_dataset = True
    side = "prefix"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.partitioner: Any = None
        self.head: Any = None
        self._next_id = 0
        self._rr = 0
        #: inferences of earlier configurations, for progress across a pipeline task
        self.progress_base = 0
        #: link figures by "from>to", for the stage times a configuration's bound uses
        self.links: dict[str, dict] = {}
        #: the routes a pipeline partitioner planned, with its predictions (None: the pair's)
        self.plans: list[tuple[Route, dict | None]] | None = None
        #: the unsplit model's outputs per preloaded input (by id), the fidelity reference
        self.references: dict[int, list] = {}
        #: per chain member, its layers' CPU busy in a pipeline over its profile's
        self.busy_factors: dict[str, float] = {}

    def on_setup(self, config: SetupConfig) -> SetupInfo:
        """Model, dataset and the partitioner (set up later, with its context); then the
        unsplit model's output on every preloaded input, the reference each inference's
        output is compared with (untimed: nothing is measured yet)."""

        info = super().on_setup(config)
        p = config.partitioner or PartitionerConfig()
        self.partitioner = create_partitioner(p.name, **(p.params or {}))
        info.partitioner_needs = sorted(self.partitioner.needs)
        self.weights = "pretrained" if config.model.weights else "random"
        self.head = ChainHead(self)
        self.references = reference_outputs(self.split_model, self.inputs)
        return info

    def on_connect_partners(self, wiring: Wiring) -> dict:
        """Open one authenticated data channel per downstream partner."""
        out = super().on_connect_partners(wiring)
        require_channels(self)
        return out

    def prepare_partitioner(self, measured: Measurements) -> PartitionerPlan:
        """Set up the partitioner with the model facts plus the observer's measurements."""
        self.links = dict(measured.links or {})
        ctx = PartitionContext(info=self.setup_info, measurements=measured)
        request = measured.fidelity
        if "fidelity" in self.partitioner.needs:
            request = self.partitioner.probe_request()
        ctx.fidelity = None if request is None else self.probe_fidelity(request)
        self.partitioner.setup(ctx)
        plan = getattr(self.partitioner, "plan", None)
        if plan is not None and measured.profiles:
            placements = plan(self.pipeline_context(measured))
            self.plans = [(Route(tuple(p.chain), tuple(p.cuts)), predicted_of(p))
                          for p in placements]
        return PartitionerPlan(sweep_length=self.partitioner.sweep_length(),
                               decision=self.with_busy(self.partitioner.decision()),
                               fidelity=ctx.fidelity)

    def with_busy(self, decision: dict | None) -> dict | None:
        """``decision`` with how much more each chain member's layers cost busy than in
        its profile (``busy_factor``, when the busy probe ran)."""
        if decision is None or not self.busy_factors:
            return decision
        return {**decision, "busy_factor": dict(self.busy_factors)}

    def final_decision(self) -> dict | None:
        """The partitioner's decision as plain JSON, with the busy probe's factors."""
        return self.with_busy(super().final_decision())

    def probe_fidelity(self, request: dict) -> dict:
        """The start-up fidelity probe (:func:`experiment_design.runtime.fidelity.probe`)
        of the pairs ``request`` names: ``transports`` (cyclic's form; each at its own
        ``splits`` or every allowed one), ``splits`` (``"all"`` or a list), ``max_splits``
        (at most that many cuts, evenly spread) and ``items`` (preloaded inputs, default 2).
        Untimed work: it runs before anything is measured."""

        valid = list(self.split_model.valid_splits())
        splits = request.get("splits", "all")
        if isinstance(splits, list):
            valid = [k for k in valid if k in {int(s) for s in splits}]
        if request.get("max_splits"):
            valid = spread(valid, int(request["max_splits"]))
        pairs = [(k, cfg) for k in valid for _, only, cfg in parse_transports(request["transports"])
                 if only is None or k in only]
        out = probe(self.split_model, self.inputs, self.references, pairs,
                    int(request.get("items") or 2))
        log.info("fidelity probe: %d pairs on %d inputs in %.1f s", len(out["pairs"]),
                 out["items"], out["seconds"])
        return {**out, "splits": valid}

    def probe_link(self, params: LinkProbe) -> dict:
        """``DataChannel.probe()`` when the transport has it, else an echo round trip of
        ``params.size`` bytes (1 MiB by default), ``params.repeats`` times (5)."""
        import torch

        size = 1 << 20 if params.size is None else params.size
        repeats = 5 if params.repeats is None else params.repeats
        name, ch = self.channels[0]
        if hasattr(ch, "probe"):
            res = ch.probe()
            return res if isinstance(res, dict) else {"result": res}
        small = {"x": torch.zeros(1)}
        big = {"x": torch.zeros(max(1, size // 4))}
        rtts, bigs = [], []
        for _ in range(max(1, repeats)):
            for payload, sink in ((small, rtts), (big, bigs)):
                t0 = time.perf_counter()
                ch.send({"op": "echo"}, payload)
                ch.recv()
                sink.append((time.perf_counter() - t0) * 1e3)
        rtt = statistics.median(rtts)
        # the echo carries the payload both ways
        extra = max(statistics.median(bigs) - rtt, 1e-3)
        return {"partner": name, "rtt_ms": rtt, "bandwidth_Bps": 2 * size / (extra / 1e3)}

    def probe_bandwidth(self, nbytes: int) -> LinkSample:
        """One short probe of the first data channel (an adaptive partitioner's): ``nbytes``
        sent raw and acknowledged, its round trip on this host's clock (the estimate takes
        the round trip off). Costs three round trips and the bytes' time, between two
        inferences, never inside one."""
        _, ch = self.channels[0]
        res = ch.probe(sizes=(int(nbytes),), rounds=1)
        ms = next(s["ms"] for s in res["samples"] if s["bytes"] == int(nbytes))
        return LinkSample(t=time.time(), nbytes=int(nbytes), ms=float(ms), source="probe")

    def warmup(self, n: int) -> None:
        """n round trips at split 0 and at the last split: every layer runs on both sides."""
        if not self.inputs:
            return
        sm = self.split_model
        valid = sm.valid_splits()
        ends = sorted({valid[0], valid[-1]})
        for i in range(n):
            for k in ends:
                x, label, item = self.inputs[i % len(self.inputs)]
                self.infer(x, label, item, k, record=False)

    def route_for(self, split: int) -> Route:
        """The two-stage route of split ``split``: this edge, then the next partner in turn."""
        name = self.channels[self._rr % len(self.channels)][0]
        self._rr += 1
        return Route((self.instance, name), (int(split),))

    def infer(self, x: Any, label: Any, item: str, split: int | Route, *,
              record: bool = True, codec: Any = None) -> InferenceRecord:
        """One inference alone in the chain (``split``: a cut, or a whole route); returns
        (and, if record, emits) its row. What crosses the head's cut is sent with ``codec``
        (a CodecConfig), else with the transport of the partitioner's latest decision when
        it names one (recorded inferences), else the manifest's. Never raises for a compute
        error; a broken channel is recorded and then re-raised."""
        route = split if isinstance(split, Route) else self.route_for(split)
        iid = self._next_id if record else -1
        if record:
            self._next_id += 1
        if codec is None and record:
            codec = getattr(self.partitioner, "transport", None)
        t_unix = time.time()
        done = self.head.once(route, x, iid, codec=codec)
        row, layer_rows = self.rows_of(done, label, item, self.references.get(id(x)))
        row["t_unix"] = t_unix
        if record:
            self.emit_record(row, layer_rows)
            if route.k > 1:  # every stage's own times: the latency budget's parts

                self.emit_stages(stage_rows(done, route.label, "latency"))
        if done.link_error:
            raise TracrError(row["error"])
        return row

    def run_config(self, route: Route, mode: str, count: int, in_flight: int = 1, *,
                   links: dict | None = None, predicted: dict | None = None,
                   bandwidth: str = "") -> dict:
        """Measure one configuration: ``count`` inferences along ``route`` in ``mode``
        ("latency": one at a time; "throughput": up to ``in_flight`` at once). Every
        inference is recorded (``inferences.csv``, ``layers.csv``, ``stages.csv``) and the
        configuration's summary (``configs.csv``) is returned and recorded."""

        inputs = self.inputs
        done: list[Completed] = []
        first = self._next_id
        self._next_id += count

        def record(c: Completed) -> None:
            x, label, item = inputs[(c.iid - first) % len(inputs)]
            row, layer_rows = self.rows_of(c, label, item, self.references.get(id(x)))
            self.emit_record(row, layer_rows)
            self.emit_stages(stage_rows(c, route.label, mode))
            done.append(c)
            self.progress(done=self.progress_base + len(done))

        for i in range(2):  # unrecorded: every stage builds and warms its code for this range
            self.head.once(route, inputs[i % len(inputs)][0], -1)
        if mode == "throughput" and route.k > 1:
            self.head.pipelined(route, inputs, count, in_flight, first, record)
        else:
            for i in range(count):
                if self.cancel_event.is_set() or self.stop_event.is_set():
                    break
                c = self.head.once(route, inputs[i % len(inputs)][0], first + i)
                record(c)
                if c.link_error:
                    raise TracrError(c.error)
        summary = summarize(done, mode=mode, in_flight=in_flight, batch=self.batch,
                            links=self.links if links is None else links,
                            bandwidth=bandwidth, predicted=predicted)
        self.emit_config({**summary["row"], "stages": summary["stages"]})
        return summary

    @property
    def batch(self) -> int:
        """Items per inference (the manifest's ``model.batch``)."""
        return int(self.config.model.batch or 1)

    def placements(self) -> list[tuple[Route, dict | None]]:
        """The configurations to measure: the partitioner's plan when it makes one
        (pipeline partitioners), else every split it allows with each partner in turn
        (the pair's routes: edge-to-edge and edge-to-server in one run, say)."""
        if self.plans is not None:
            return list(self.plans)
        allowed = self.partitioner.params.get("splits")
        splits = self.partitioner.ctx.valid_splits
        if isinstance(allowed, list):
            splits = [k for k in splits if k in set(map(int, allowed))]
        return [(Route((self.instance, partner), (k,)), None)
                for partner, _ in self.channels for k in splits]

    def solo(self, device: str, count: int) -> dict:
        """The whole model ``count`` times on one participant alone (the single-device
        baseline): this head on its own inputs, or a partner on the input it is sent."""

        if device == self.instance:
            done = []
            for i in range(count):
                c = self.head.once(Route((self.instance,), ()), self.inputs[i % len(self.inputs)][0],
                                   -1)
                done.append(c)
            ms = [c.e2e_ms for c in done if not c.error]
            return {"instance": device, "throughput_per_s": throughput_per_s(done, "latency", 1),
                    "latency_ms_p50": statistics.median(ms) if ms else None}
        ch = self.downstream[device]
        # the partner reports between passes, well within the link's liveness deadline
        ch.send({"op": "solo", "count": int(count), "progress_s": self.liveness_s / 4},
                {"x": self.inputs[0][0]})
        for _ in range(int(count) + 1):  # at most one report a pass, then the result
            header, _, _ = ch.recv()
            if header.get("op") != "progress":
                break
        else:
            raise TracrError(f"{device}: the baseline reported more passes than {count}")
        if header.get("error"):
            raise TracrError(f"{device}: {header['error']}")
        return {"instance": device, "throughput_per_s": header["throughput_per_s"],
                "latency_ms_p50": header["latency_ms_p50"]}

    def rows_of(self, c: Completed, label: Any, item: str,
                ref: list | None = None) -> tuple[InferenceRecord, list]:
        """The ``inferences.csv`` row and the ``layers.csv`` rows of one inference.

        With more than two stages, ``cloud_*``, ``decode_ms`` and ``encode_ms`` sum over
        every stage after the head (``stages.csv`` has each one); ``transfer_ms`` is what
        is left of the end-to-end time: the wire, and in throughput mode the queues.
        ``transport`` names what the head sent with; against ``ref`` (the unsplit model's
        output on the same input) the row gets ``top1_agree``, ``cosine`` and
        ``max_abs_diff``, and with real weights and a class-index label ``correct``.
        """

        sm = self.split_model
        route = c.route
        split = route.cuts[0] if route.cuts else sm.n
        row = InferenceRecord(
            inference=c.iid, item=item, label=label if not isinstance(label, list)
            else ";".join(map(str, label)), split=split, layer=sm.points[split].layer,
            weights=self.weights, partner=route.route[1] if route.k > 1 else "",
            transport=transport_label(c.codec or self.codec) if route.k > 1 else "",
            error=c.error or "",
        )
        if c.error:
            return row, []
        stages = c.stages()
        head, rest = stages[0], stages[1:]
        edge_ms = head["compute_ms"]
        e2e_ms = c.e2e_ms
        enc = float(head.get("encode_ms") or 0.0) + sum(
            float(s.get("encode_ms") or 0.0) for s in rest[:-1])
        dec = sum(float(s.get("decode_ms") or 0.0) for s in rest)
        later = sum(float(s.get("compute_ms") or 0.0) for s in rest)
        row.update(
            edge_ms=edge_ms, encode_ms=enc, decode_ms=dec, cloud_ms=later,
            edge_cpu_ms=head["cpu_ms"],
            cloud_cpu_ms=sum(float(s.get("cpu_ms") or 0.0) for s in rest) if rest else None,
            transfer_ms=e2e_ms - edge_ms - enc - dec - later, e2e_ms=e2e_ms,
            bytes_raw=head.get("bytes_raw", 0), bytes_encoded=head.get("bytes_encoded", 0),
            n_crossing=head.get("n_crossing", 0),
        )
        outs = c.outputs if c.outputs is not None else {}
        if route.k > 1:
            outs = [outs[k] for k in sorted(outs, key=lambda s: int(s[3:]))]
        else:
            from experiment_design.split import flatten_output  # loads torch (see roles/base)

            outs = flatten_output(outs)
        if outs:
            first = outs[0]
            row["top1"] = int(first.reshape(first.shape[0], -1)[0].argmax()) \
                if first.dim() > 0 and first.numel() else ""
            row["output_sum"] = float(sum(float(o.double().sum()) for o in outs))
            if ref is not None:
                row.update(compare(outs, ref))
            if self.weights == "pretrained" and type(label) is int:
                row["correct"] = int(top1s(first)[:1] == [label])
        layer_rows = []
        for s in stages:
            hop = int(s.get("hop", 0))
            side = "edge" if hop == 0 else "cloud" if hop == route.k - 1 else f"stage{hop}"
            layer_rows += [_layer(c.iid, side, sm, int(i), float(ms), s.get("instance"))
                           for i, ms in s.get("layers", [])]
        return row, layer_rows



def _layer(iid: int, side: str, sm: Any, index: int, ms: float,
           instance: str | None = None) -> LayerRecord:
    """One layer row; ``instance`` is the stage that ran it (the observer fills in the
    reporting participant when it is not known)."""
    info = sm.layers[index - 1]
    row = LayerRecord(inference=iid, side=side, index=index, name=info.name, type=info.type,
                      ms=ms)
    if instance:
        row["instance"] = instance
    return row
