"""``predicted-argmin``: the split with the lowest predicted end-to-end time.

For every valid split k it predicts

    edge_ms(1..k) + crossing_bytes(k) / bandwidth + rtt + cloud_ms(k+1..n)

and picks the minimum. Layer times come, by default, straight from each
device's warm-up profile: those are measurements of each layer on that device,
taken in the context of the full model, so they are the best predictor there
is. Per-class regressions on FLOPs, input/output bytes and parameter count
(non-negative coefficients) fill in layers the profile did not time, or
replace the profile entirely with ``source: regression`` (to see how well the
regressions generalize). The helpers here are shared with ``neurosurgeon``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.partitioners import regression
from experiment_design.partitioners.base import (
    PartitionContext,
    Partitioner,
    register_partitioner,
)

SOURCES = ("profile", "regression")


def layer_ms_of(profile: Mapping, n: int) -> list | None:
    """Per-layer ms list (layers 1..n) from a profile dict, or None if it has none.

    Accepts ``{"layer_ms": [ms, ...]}`` and the participant's
    ``profile_layers()`` form ``{"layers": {"1": ms, ...}}`` (a layer missing
    there, e.g. one the timing hooks could not see, becomes None).
    """
    if profile.get("layer_ms") is not None:
        return list(profile["layer_ms"])
    by_index = profile.get("layers")
    if isinstance(by_index, Mapping):
        return [by_index.get(str(i), by_index.get(i)) for i in range(1, n + 1)]
    return None


def calibration(profile: Mapping | None, layer_ms: Sequence[float | None]) -> float:
    """Factor that makes the per-layer medians add up to the measured full pass.

    A median per layer drops the stalls a CPU quota (cgroup throttling) or a
    busy neighbour puts into a few runs, so the sum of the medians under-states
    what a whole prefix costs. The participant also times untimed full passes
    (``full_ms``, a median of whole runs); scaling every layer by
    ``full_ms / sum(medians)`` keeps the per-layer shape and restores the total.
    1.0 when the profile has no ``full_ms`` (older participants) or nothing to scale.
    """
    full = (profile or {}).get("full_ms")
    total = sum(float(v) for v in layer_ms if v is not None)
    if full is None or total <= 0 or not math.isfinite(float(full)) or float(full) <= 0:
        return 1.0
    return float(full) / total


def profile_ms(ctx: PartitionContext, side: str, calibrate: bool = True) -> list[float | None]:
    """The measured per-layer ms (layers 1..n) of ``side`` ("edge" or "cloud").

    With ``calibrate`` (default) the layer times are scaled by :func:`calibration`
    so they sum to the measured full-pass median; neurosurgeon and
    predicted-argmin both read their layer times here.
    """
    prof = getattr(ctx, f"{side}_profile")
    ms = layer_ms_of(prof, len(ctx.layers)) if prof else None
    if ms is None:
        raise TracrError(
            f"No {side} profile: this partitioner needs per-layer times measured on the {side}.",
            hint="The runner profiles each participant at start-up; check the participant logs.",
        )
    if len(ms) != len(ctx.layers):
        raise TracrError(
            f"The {side} profile has {len(ms)} layer times but the model has {len(ctx.layers)} layers.",
            hint="Both participants must build the same model (same depth and split mode).",
        )
    out = [None if v is None or not math.isfinite(float(v)) else float(v) for v in ms]
    if calibrate:
        f = calibration(prof, out)
        out = [None if v is None else v * f for v in out]
    return out


def link(ctx: PartitionContext, params: Mapping[str, Any]) -> tuple[float, float, str]:
    """(bandwidth bytes/s, rtt ms, source): the measured link, or a stated what-if override."""
    bw, rtt = params.get("bandwidth_Bps"), params.get("rtt_ms")
    if bw is not None:
        return float(bw), float(rtt or 0.0), "param (what-if, not measured)"
    net = ctx.network
    if not net or not net.get("bandwidth_Bps"):
        raise TracrError(
            "No measured network speed: this partitioner needs the link probed at start-up.",
            hint="The runner probes the data channel before the first inference; "
            "set params.bandwidth_Bps only for an offline what-if.",
        )
    if float(net["bandwidth_Bps"]) <= 0:
        raise TracrError(
            f"Measured bandwidth is {net['bandwidth_Bps']} B/s; cannot predict transfers."
        )
    return float(net["bandwidth_Bps"]), float(net.get("rtt_ms") or 0.0), "measured"


def crossing_bytes(ctx: PartitionContext) -> dict[int, int]:
    """Bytes that cross at each split k (from the split points)."""
    out = {int(p["index"]): int(p.get("crossing_bytes") or 0) for p in ctx.points}
    if not out:
        raise TracrError("The partition context has no split points.")
    return out


def transfer_ms(nbytes: float, bandwidth_Bps: float, rtt_ms: float = 0.0) -> float:
    """Time to move ``nbytes`` over a link: bytes / bandwidth (+ rtt), in ms."""
    return nbytes / bandwidth_Bps * 1000.0 + rtt_ms


def totals(
    edge_ms: Sequence[float],
    cloud_ms: Sequence[float],
    cross: Mapping[int, int],
    splits: Sequence[int],
    bandwidth_Bps: float,
    rtt_ms: float,
) -> dict[int, dict]:
    """Predicted {k: {edge_ms, transfer_ms, cloud_ms, total_ms}} for each split in ``splits``."""
    n = len(edge_ms)
    pre = [0.0]
    for v in edge_ms:
        pre.append(pre[-1] + v)
    suf = [0.0] * (n + 1)
    for j in range(n - 1, -1, -1):
        suf[j] = suf[j + 1] + cloud_ms[j]
    out = {}
    for k in splits:
        t = transfer_ms(cross[k], bandwidth_Bps, rtt_ms)
        out[k] = {
            "edge_ms": pre[k],
            "transfer_ms": t,
            "cloud_ms": suf[k],
            "total_ms": pre[k] + t + suf[k],
        }
    return out


def throttled_ms(cpu_ms: float, idle_ms: float, quota_ms: float, period_ms: float,
                 cycles: int = 120, warmup: int = 12) -> float:
    """Median wall time of a ``cpu_ms`` burst under CFS bandwidth control, steady state.

    The process alternates ``cpu_ms`` of work and ``idle_ms`` of waiting (the
    transfer and the cloud's part, for an edge prefix). The kernel refills the
    budget to ``quota_ms`` at every ``period_ms`` boundary; once it is spent the
    process stalls until the next boundary. So a short prefix after an idle
    spell runs at full speed, while a long one (or back-to-back passes) runs at
    about ``cpu_ms * period / quota``: per-layer medians alone see neither.
    """
    if cpu_ms <= 0:
        return 0.0
    if quota_ms <= 0 or period_ms <= 0 or quota_ms >= period_ms:
        return cpu_ms
    import random

    # a little jitter in the idle time (poll and scheduling noise) keeps the simulated
    # process from locking onto one phase of the period, as the real one does not
    rng = random.Random(0)
    t, budget, walls = 0.0, quota_ms, []
    eps = 1e-9
    for i in range(warmup + cycles):
        start, left = t, cpu_ms
        while left > eps:
            boundary = (math.floor(t / period_ms + eps) + 1) * period_ms
            if budget > eps:
                dt = min(left, budget, boundary - t)
                t, left, budget = t + dt, left - dt, budget - dt
            else:
                t = boundary
            if t >= boundary - eps:
                budget = quota_ms
        if i >= warmup:
            walls.append(t - start)
        before = math.floor(t / period_ms + eps)
        t += max(0.0, idle_ms) + rng.uniform(0.0, 0.05 * period_ms)
        if math.floor(t / period_ms + eps) > before:
            budget = quota_ms
    walls.sort()
    return walls[len(walls) // 2]


def fit_cpu_scale(layer_sum_ms: float, full_ms: float, quota_ms: float,
                  period_ms: float) -> float:
    """Scale for the per-layer times so back-to-back throttled passes take ``full_ms``.

    The participant measured ``full_ms`` with no idle time between passes; the
    scale that makes :func:`throttled_ms` reproduce it turns the (mostly
    unthrottled) layer medians into CPU costs consistent with the whole pass.
    """
    if layer_sum_ms <= 0 or full_ms <= 0:
        return 1.0
    lo, hi = 0.05, 20.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if throttled_ms(mid * layer_sum_ms, 0.0, quota_ms, period_ms, cycles=30) < full_ms:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def cold_prefix_of(profile: Mapping | None, n: int) -> list[float] | None:
    """The profile's cold prefix curve as ``[0, W(1), ..., W(n)]`` (made non-decreasing),
    or None when the profile has none or it misses a layer.

    ``W(k)`` is the measured median wall time from the start of a pass to the end of
    layer k, for passes that start after an idle spell (``roles/profiling.py``).
    """
    raw = (profile or {}).get("prefix_cold_ms")
    if not isinstance(raw, Mapping):
        return None
    out = [0.0]
    for i in range(1, n + 1):
        v = raw.get(str(i), raw.get(i))
        if v is None or not math.isfinite(float(v)):
            return None
        out.append(max(out[-1], float(v)))
    return out


def edge_after_idle(cold: Sequence[float], k: int, idle_ms: float, period_ms: float,
                    full_ms: float) -> float:
    """Predicted wall time of an edge prefix 1..k under a CFS quota, ``idle_ms`` after the
    previous inference's prefix ended.

    An idle spell of a whole period or more refills the quota, so the prefix runs as in
    the profile's cold passes: ``cold[k]``. Back to back (no idle) it runs at the rate of
    untimed back-to-back full passes, ``cold[k] * full_ms / cold[n]``; shorter idle
    spells fall in between, linearly in ``idle_ms / period_ms``.
    """
    warm = cold[k] * (full_ms / cold[-1]) if cold[-1] > 0 and full_ms > 0 else cold[k]
    f = min(1.0, max(0.0, idle_ms / period_ms)) if period_ms > 0 else 1.0
    return f * cold[k] + (1.0 - f) * max(warm, cold[k])


def prefix_cpu_of(profile: Mapping | None, n: int) -> list[float] | None:
    """``[0, C(1), ..., C(n)]``: the CPU time of each prefix, the profile's ``full_cpu_ms``
    spread over the layers by their fastest runs (``layers_min``); None without them."""
    prof = profile or {}
    full_cpu = prof.get("full_cpu_ms")
    mins = layer_ms_of({"layers": prof.get("layers_min")}, n) if prof.get("layers_min") else None
    if not full_cpu or not mins or any(v is None for v in mins) or sum(mins) <= 0:
        return None
    scale, out = float(full_cpu) / sum(mins), [0.0]
    for v in mins:
        out.append(out[-1] + float(v) * scale)
    return out


def handoff_ms(profile: Mapping | None, cpu_ms: float) -> float:
    """The stall a CPU quota adds at the end of a prefix of ``cpu_ms`` CPU time, when the
    edge hands its tensors on: the profile's ``handoff`` points (``roles/profiling.py``)
    interpolated linearly in CPU time from (0, 0), flat past the last; 0 without them."""
    raw = (profile or {}).get("handoff") or []
    pts = sorted((float(h["cpu_ms"]), float(h["stall_ms"])) for h in raw
                 if h.get("cpu_ms") is not None and h.get("stall_ms") is not None)
    if not pts or cpu_ms <= 0:
        return 0.0
    xs, ys = [0.0] + [c for c, _ in pts], [0.0] + [v for _, v in pts]
    if cpu_ms >= xs[-1]:
        return ys[-1]
    for i in range(1, len(xs)):
        if cpu_ms <= xs[i]:
            span = xs[i] - xs[i - 1]
            f = (cpu_ms - xs[i - 1]) / span if span > 0 else 1.0
            return ys[i - 1] + f * (ys[i] - ys[i - 1])
    return ys[-1]


def summarize_inputs(ctx: PartitionContext) -> dict:
    """A short, printable summary of the context (what the decision was based on)."""

    def side(p: dict | None) -> dict | None:
        if not p:
            return None
        ms = [float(v) for v in (layer_ms_of(p, len(ctx.layers)) or []) if v is not None]
        keep = {k: v for k, v in p.items() if not isinstance(v, list | dict)}
        return {
            **keep,
            "layers_timed": len(ms),
            "sum_layer_ms": sum(ms),
            "models_shipped": bool(p.get("models")),
        }

    return {
        "layers": len(ctx.layers),
        "valid_splits": len(ctx.valid_splits),
        "edge_profile": side(ctx.edge_profile),
        "cloud_profile": side(ctx.cloud_profile),
        "network": ctx.network,
    }


@register_partitioner("predicted-argmin")
class PredictedArgmin(Partitioner):
    """Pick the valid split with the lowest predicted edge + transfer + cloud time.

    Params: ``source`` — ``profile`` (default: the profiled per-layer times,
    regression only for layers without a time) or ``regression`` (per-class
    non-negative regressions on FLOPs, bytes and params for every layer);
    ``include_rtt`` (default true) adds one round-trip time to each transfer;
    ``calibrate`` (default true) scales each side's layer times so they add up
    to that side's measured full-pass median (see :func:`calibration`);
    ``throttle`` (default true): when the edge reports a CFS CPU quota, its
    prefix times come from :func:`throttled_ms` instead (full speed until the
    period's quota is spent, then stalls) on CPU costs: the measured CPU time of
    a full pass (``full_cpu_ms``) spread over the layers by their profiled
    shares (or, without it, fitted so back-to-back passes take ``full_ms``);
    ``cold`` (default true): when the edge profile also has a cold prefix curve
    (passes timed after an idle spell, as an edge prefix runs between inferences),
    the prefix times under a quota come from that measured curve instead
    (:func:`edge_after_idle`), and the CFS model is not needed;
    ``handoff`` (default true): under a quota, each prefix also pays the stall the edge
    profile measured when a prefix ends and the process next gives up the CPU
    (:func:`handoff_ms`: the quota's debt, collected at the hand-off to the link);
    ``bandwidth_Bps`` / ``rtt_ms`` override the measured link for a what-if.
    """

    needs = frozenset({"edge_profile", "cloud_profile", "network"})

    def __init__(self, source: str = "profile", include_rtt: bool = True, **params: Any) -> None:
        super().__init__(source=source, include_rtt=include_rtt, **params)
        if source not in SOURCES:
            raise TracrError(
                f"predicted-argmin: unknown source '{source}'.", hint=f"Use one of {list(SOURCES)}."
            )
        self.source = source
        self.include_rtt = bool(include_rtt)
        self.k: int | None = None
        self._decision: dict = {}

    def _layer_times(
        self, ctx: PartitionContext, side: str, calibrate: bool | None = None
    ) -> tuple[list[float], dict]:
        if calibrate is None:
            calibrate = bool(self.params.get("calibrate", True))
        measured = profile_ms(ctx, side, calibrate=calibrate)
        timed = [(row, ms) for row, ms in zip(ctx.layers, measured, strict=True) if ms is not None]
        prof = getattr(ctx, f"{side}_profile")
        raw = profile_ms(ctx, side, calibrate=False)
        info: dict = {
            "profiled_layers": len(timed),
            "calibration": calibration(prof, raw) if calibrate else 1.0,
            "sum_layer_ms": sum(v for v in raw if v is not None),
            "full_ms": (prof or {}).get("full_ms"),
        }
        if self.source == "profile" and len(timed) == len(ctx.layers):
            info["source"] = "profile"
            return [float(v) for v in measured], info
        models = regression.fit_feature_models(
            ctx.layers, measured, type_map=self.params.get("type_map")
        )
        info["models"] = models
        if self.source == "regression":
            info["source"] = "regression"
            return [regression.predict_features(models, row) for row in ctx.layers], info
        info["source"] = "profile+regression"
        info["regressed_layers"] = [
            row["index"] for row, v in zip(ctx.layers, measured, strict=True) if v is None
        ]
        return [
            v if v is not None else regression.predict_features(models, row)
            for row, v in zip(ctx.layers, measured, strict=True)
        ], info

    def setup(self, ctx: PartitionContext) -> None:
        """Predict every valid split and keep the argmin."""
        super().setup(ctx)
        quota = (ctx.edge_profile or {}).get("cpu_quota")
        full_ms = (ctx.edge_profile or {}).get("full_ms")
        throttle = bool(self.params.get("throttle", True)) and bool(quota) and bool(full_ms)
        edge, edge_info = self._layer_times(ctx, "edge", calibrate=False if throttle else None)
        cloud, cloud_info = self._layer_times(ctx, "cloud")
        bw, rtt, link_src = link(ctx, self.params)
        rtt_used = rtt if self.include_rtt else 0.0
        pred = totals(edge, cloud, crossing_bytes(ctx), ctx.valid_splits, bw, rtt_used)
        if throttle:
            q, per = float(quota["quota_ms"]), float(quota["period_ms"])
        cold = cold_prefix_of(ctx.edge_profile, len(ctx.layers)) if throttle else None
        if cold is not None and self.params.get("cold", True):
            edge_info.update(throttle={
                "quota_ms": q, "period_ms": per, "model": "cold prefix curve",
                "full_ms": full_ms, "cold_full_ms": cold[-1],
                "cold_gap_ms": (ctx.edge_profile or {}).get("cold_gap_ms")})
            for k, p in pred.items():
                idle = p["transfer_ms"] + p["cloud_ms"]
                p["edge_ms"] = edge_after_idle(cold, k, idle, per, float(full_ms))
                p["total_ms"] = p["edge_ms"] + p["transfer_ms"] + p["cloud_ms"]
        elif throttle:
            full_cpu = (ctx.edge_profile or {}).get("full_cpu_ms")
            mins = layer_ms_of({"layers": (ctx.edge_profile or {}).get("layers_min")},
                               len(ctx.layers)) if (ctx.edge_profile or {}).get("layers_min") else None
            if mins and all(v is not None for v in mins) and sum(mins) > 0:
                # shares from each layer's fastest run (contention only adds time)
                edge = [float(v) for v in mins]
                pred = totals(edge, cloud, crossing_bytes(ctx), ctx.valid_splits, bw, rtt_used)
            if full_cpu:
                # the CPU time of a whole pass, measured: spread over the layers by their
                # profiled shares (immune to a busy host inflating the layer walls)
                scale, how = float(full_cpu) / sum(edge), "full_cpu_ms / sum(layer times)"
            else:
                scale, how = fit_cpu_scale(sum(edge), float(full_ms), q, per), "fitted to full_ms"
            edge_info.update(throttle={"quota_ms": q, "period_ms": per, "cpu_scale": scale,
                                       "cpu_scale_from": how, "full_ms": full_ms,
                                       "full_cpu_ms": full_cpu})
            for p in pred.values():
                idle = p["transfer_ms"] + p["cloud_ms"]
                cpu = p["edge_ms"] * scale
                wall = throttled_ms(cpu, idle, q, per)
                p["edge_cpu_ms"], p["edge_stall_ms"] = cpu, wall - cpu
                p["edge_ms"] = wall
                p["total_ms"] = p["edge_ms"] + p["transfer_ms"] + p["cloud_ms"]
        cpu = prefix_cpu_of(ctx.edge_profile, len(ctx.layers)) if throttle else None
        if cpu is not None and (ctx.edge_profile or {}).get("handoff") \
                and self.params.get("handoff", True):
            edge_info["throttle"]["handoff"] = (ctx.edge_profile or {})["handoff"]
            for k, p in pred.items():
                p["edge_handoff_ms"] = handoff_ms(ctx.edge_profile, cpu[k])
                p["edge_ms"] += p["edge_handoff_ms"]
                p["total_ms"] = p["edge_ms"] + p["transfer_ms"] + p["cloud_ms"]
        self.k = min(pred, key=lambda k: (pred[k]["total_ms"], k))
        self._decision = {
            "name": self.name,
            "chosen": self.k,
            "criterion": "argmin predicted edge + transfer + cloud",
            "params": self.params,
            "source": {"edge": edge_info, "cloud": cloud_info},
            "link": {"bandwidth_Bps": bw, "rtt_ms": rtt_used, "source": link_src},
            "inputs": summarize_inputs(ctx),
            "layer_ms": {"edge": edge, "cloud": cloud},
            "predicted": {k: v["total_ms"] for k, v in pred.items()},
            "predicted_parts": pred,
            "chosen_ms": pred[self.k]["total_ms"],
        }

    def next_split(self) -> int:
        """The chosen split, every time."""
        if self.k is None:
            raise TracrError("predicted-argmin: next_split() called before setup().")
        return self.k

    def decision(self) -> dict:
        """Chosen split, predicted ms per split, which layer-time source was used, the link."""
        return self._decision or {"name": self.name, "params": self.params, "chosen": None}
