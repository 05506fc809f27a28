"""The start-up probes the head of a chain runs for a pipeline planner: the planner's view
of the chain (:meth:`ChainProbes.pipeline_context`), each member's CPU beside its layers
and per byte it moves (:meth:`ChainProbes.probe_overhead`), and how much more its layers
cost busy than in its profile (:meth:`ChainProbes.probe_busy`)."""

from __future__ import annotations

import logging
import statistics
from dataclasses import replace
from typing import Any

from experiment_design.partitioners.pipeline import LinkFacts, ModelFacts, PipelineContext
from experiment_design.partitioners.pipeline_partitioners import device_from_profile
from experiment_design.protocol import Measurements
from experiment_design.runtime.chain import Route

log = logging.getLogger(__name__)


class ChainProbes:
    """The pipeline probes of :class:`~experiment_design.roles.edge.EdgeRole`, which mixes
    them in: they use its ``setup_info``, ``partitioner``, ``batch``, ``head``, ``inputs``,
    ``instance``, ``downstream`` and ``busy_factors``."""

    def pipeline_context(self, measured: Measurements) -> Any:
        """The planner's view of the chain: each member's measured per-layer times, every
        probed link (a link probed one way stands for both: replies travel back the way
        requests came), this head as the source."""

        layers, points = self.setup_info.profile, self.setup_info.points
        model = ModelFacts.from_rows(layers, points, batch=self.batch)
        allowed = self.partitioner.params.get("splits")
        if isinstance(allowed, list):  # the manifest restricts where the chain may be cut
            keep = {int(k) for k in allowed} | {0}
            model = replace(model, valid=tuple(v and k in keep for k, v in enumerate(model.valid)))
        # throughput: every stage busy all the time, so a quota'd host runs at its quota
        busy = self.partitioner.params.get("objective", "throughput") == "throughput"
        profiles = dict(measured.profiles or {})
        overheads, per_byte = self.probe_overhead(profiles, model,
                                                  byte_costs(measured.links or {}), pipe=busy)
        factors = self.busy_factors = self.probe_busy(profiles, model) if busy else {}
        devices = {name: device_from_profile(name, prof, layers, sustained=busy,
                                             overhead_cpu_ms=overheads.get(name),
                                             ns_per_byte=per_byte.get(name),
                                             busy_factor=factors.get(name))
                   for name, prof in profiles.items()}
        links: dict[tuple[str, str], Any] = {}
        for key, fig in (measured.links or {}).items():
            a, b = key.split(">", 1)
            lf = LinkFacts(float(fig["bandwidth_Bps"]), float(fig.get("rtt_ms") or 0.0))
            links[(a, b)] = lf
            links.setdefault((b, a), lf)
        return PipelineContext(model, devices, links, self.instance)

    def probe_overhead(self, profiles: dict[str, dict], model: Any,
                       per_byte: dict[str, float], pipe: bool = True
                       ) -> tuple[dict[str, float], dict[str, float]]:
        """Each chain member's CPU ms per inference beside its layers, and the CPU ns per
        byte it receives or sends: ``(overheads, ns_per_byte)``.

        :meth:`ChainHead.probe_overhead` runs along two routes through the members of
        ``profiles`` (in their order, this head first): one with the cuts spread evenly
        over the model's valid interior cuts, one at the cuts where the least crosses. A
        member's CPU beside its layers on a route is fitted as its own fixed part plus a
        per-byte part common to all members, times the bytes it received and sent there
        (:func:`fit_overheads`). Measured on the chain because the link probe's per-byte
        figure is not what a pipeline pays: on the lab's 32 MB/s links the probe gave
        0.5-1.5 ns/B, while a head sending 260 KB per inference spent 1.15-1.31 ms of CPU
        beside its layers and one sending 16 KB 0.43-0.83 ms (AlexNet; fitted: 3.5-4.9
        ns/B).

        Where the fit cannot be made (one route only, no spread in the bytes, a slope
        that is not positive), the per-byte cost is ``per_byte`` (the link probes') and
        the overhead what the first route measured less it. Empty dicts when the chain is
        one member, the model has too few cuts, or every probe fails (the planner then
        counts no overhead; the log says why). ``pipe``: through throughput mode's
        threads, for a throughput plan."""
        spread = self.probe_route(profiles, model)
        if spread is None:
            return {}, {}
        cuts = [k for k in range(1, model.n) if model.valid[k]]
        least = tuple(sorted(sorted(cuts, key=lambda k: (model.crossing_bytes[k], k))
                             [: spread.k - 1]))
        points: dict[str, list[tuple[float, float]]] = {}
        first: dict[str, float] = {}
        for route in dict.fromkeys((spread, Route(spread.route, least))):
            try:
                out = self.head.probe_overhead(route, self.inputs, pipe=pipe)
            except Exception as exc:  # the plan can still be made, without this route
                log.warning("overhead probe along %s failed: %s", route.label, exc)
                continue
            log.info("overhead probe along %s: %s", route.label,
                     ", ".join(f"{k} {v:.3f} ms CPU" for k, v in out.items()))
            for name, moved in moved_bytes(route, model).items():
                if name in out:
                    points.setdefault(name, []).append((moved, out[name]))
                    first.setdefault(name, out[name] - per_byte.get(name, 0.0) * moved / 1e6)
        fit = fit_overheads(points)
        if fit is None:
            return {k: max(0.0, v) for k, v in first.items()}, dict(per_byte)
        fixed, ns = fit
        log.info("overhead fit: %.2f ns/B moved; fixed %s", ns,
                 ", ".join(f"{k} {v:.3f} ms CPU" for k, v in fixed.items()))
        return fixed, {name: ns for name in fixed}

    def probe_route(self, profiles: dict[str, dict], model: Any) -> Route | None:
        """The route the start-up probes take: this head, then the other members of
        ``profiles`` in their order, cut evenly over the model's valid interior cuts;
        None when the chain is one member, the model has too few cuts, or the head has
        no channel to the next member."""
        members = list(profiles)
        cuts = [k for k in range(1, model.n) if model.valid[k]]
        if len(members) < 2 or self.instance not in members or len(cuts) < len(members) - 1:
            return None
        members = [self.instance, *[m for m in members if m != self.instance]]
        if members[1] not in self.downstream:
            return None
        step = len(cuts) / len(members)
        return Route(tuple(members), tuple(cuts[int(step * (i + 1))]
                                           for i in range(len(members) - 1)))

    def probe_busy(self, profiles: dict[str, dict], model: Any,
                   in_flight: int = 4) -> dict[str, float]:
        """Each chain member's layers' CPU with ``in_flight`` inferences in the chain
        (:meth:`ChainHead.probe_busy`, along the route with the cuts spread evenly) over
        their CPU in its start-up profile (``layers_cpu``): how much more a busy stage's
        layers cost than its profile says, clamped to 0.8-2. Empty for a member without
        per-layer CPU times, and when the chain is one member or the probe fails."""
        route = self.probe_route(profiles, model)
        if route is None:
            return {}
        try:
            busy = self.head.probe_busy(route, self.inputs, in_flight=in_flight)
        except Exception as exc:  # the plan can still be made, at the profiles' CPU
            log.warning("busy probe along %s failed: %s", route.label, exc)
            return {}
        out = {}
        for hop, name in enumerate(route.route):
            cpu = (profiles.get(name) or {}).get("layers_cpu")
            a, b = route.bounds(hop, model.n)
            if not isinstance(cpu, dict) or name not in busy:
                continue
            base = sum(float(cpu.get(str(i), cpu.get(i)) or 0.0) for i in range(a + 1, b + 1))
            if base > 0.05:
                out[name] = min(2.0, max(0.8, busy[name] / base))
        log.info("busy probe along %s: %s", route.label,
                 ", ".join(f"{k} x{v:.2f}" for k, v in out.items()))
        return out


def moved_bytes(route: Route, model: Any) -> dict[str, int]:
    """The bytes each participant of ``route`` receives and sends per inference, as the
    planner counts them (``experiment_design.partitioners.pipeline``): what crosses its
    cuts, the last sending the model's output back. The head's receiving that output is
    the same on every route, so it stays in the head's fixed part."""
    bounds = [0, *route.cuts]
    return {name: ((model.crossing_bytes[bounds[i]] if i else 0)
                   + (model.crossing_bytes[route.cuts[i]] if i < len(route.cuts)
                      else model.output_bytes))
            for i, name in enumerate(route.route)}


def fit_overheads(points: dict[str, list[tuple[float, float]]]
                  ) -> tuple[dict[str, float], float] | None:
    """``(fixed CPU ms per member, CPU ns per byte)`` by least squares from each member's
    ``(bytes moved, CPU ms beside its layers)`` on the probed routes: a fixed part per
    member and one per-byte slope for all (the same channel code moves every byte).
    None when the bytes do not vary within any member or the slope is not positive;
    a fixed part below 0 is clamped to 0."""
    num = den = 0.0
    for pts in points.values():
        if len(pts) < 2:
            continue
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        num += sum((x - mx) * (y - my) for x, y in pts)
        den += sum((x - mx) ** 2 for x, _ in pts)
    if den <= 0 or num <= 0:
        return None
    slope = num / den  # ms per byte
    fixed = {name: max(0.0, sum(y - slope * x for x, y in pts) / len(pts))
             for name, pts in points.items() if pts}
    return fixed, slope * 1e6


def byte_costs(links: dict[str, dict]) -> dict[str, float]:
    """Each device's CPU ns per byte it sends or receives, from the probed links
    (``"a>b"`` -> ``send_ns_per_byte`` charged to a, ``recv_ns_per_byte`` to b): the
    median of its figures. On the lab's 32 MB/s links, 0.5-0.9 ns/B to send and 0.8-1.5
    to receive, the network stack's work included. A pipeline pays more (3.5-4.9 ns/B
    fitted on the chain), so this is only the fallback of :meth:`ChainProbes.probe_overhead`."""
    seen: dict[str, list[float]] = {}
    for key, fig in links.items():
        a, _, b = key.partition(">")
        for name, value in ((a, fig.get("send_ns_per_byte")), (b, fig.get("recv_ns_per_byte"))):
            if isinstance(value, (int, float)) and value >= 0:
                seen.setdefault(name, []).append(float(value))
    return {name: statistics.median(v) for name, v in seen.items()}


def predicted_of(p: Any) -> dict:
    """What a placement ``p`` predicts, for the configuration that measures it: its
    throughput and latency, and per stage the layers' time (``compute_ms``), its CPU
    beside them (``overhead_ms``), its outgoing transfer and its period (``stage_ms``),
    so a run shows which stage a prediction missed."""
    overhead = p.overhead_ms or (0.0,) * len(p.compute_ms)
    return {"throughput_per_s": p.predicted_throughput_per_s,
            "latency_ms": p.predicted_latency_ms,
            "stages": [{"compute_ms": c, "overhead_ms": o, "transfer_ms": t, "stage_ms": s}
                       for c, o, t, s in zip(p.compute_ms, overhead, p.transfer_ms,
                                             p.stage_ms, strict=True)]}
