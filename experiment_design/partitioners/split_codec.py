"""``split-codec``: the split and the transport chosen together, under a fidelity floor.

A lossy transport (float16, int8, int4, a JPEG of the input) sends fewer bytes at a cut
and changes the output a little. Which (split, transport) pair is fastest end to end
depends on the link; which pairs are allowed depends on how faithful the output must
stay. For every pair the head probed at start-up (``needs`` ``fidelity``: the prefix,
the crossing values encoded and decoded, the suffix, compared with the unsplit model on
a few preloaded inputs, see :func:`experiment_design.runtime.fidelity.probe`) it predicts

    edge_ms(1..k) + encode_ms + bytes / bandwidth + rtt + decode_ms + cloud_ms(k+1..n)

and picks the fastest pair whose probed fidelity meets the floor. The layer times and
the link are predicted-argmin's (the start-up profiles and the probed link). The head
times the decode, but the cloud runs it: ``decode_ms`` is the probe's CPU time of the
decode scaled by :func:`far_side_factor` (the cloud's wall time per unit of the head's CPU
time), not the head's wall time, which a slowed edge stretches.
"""

from __future__ import annotations

from typing import Any

from experiment_design.errors import TracrError
from experiment_design.partitioners.base import (
    PartitionContext,
    Partitioner,
    register_partitioner,
)
from experiment_design.partitioners.cyclic import parse_transports
from experiment_design.partitioners.predicted import PredictedArgmin

#: the transports tried when the manifest names none: lossless, float16, int8 (per tensor
#: and per channel), int4, and the input as JPEG/WebP (split 0 only)
DEFAULT_TRANSPORTS: list[dict] = [
    {"codec": "zstd", "level": 1},
    {"lossy": "float16", "codec": "zstd", "level": 1},
    {"lossy": "int8", "granularity": "tensor", "codec": "zstd", "level": 1},
    {"lossy": "int8", "granularity": "channel", "codec": "zstd", "level": 1},
    {"lossy": "int4", "granularity": "tensor", "codec": "zstd", "level": 1},
    *({"lossy": m, "quality": q, "codec": "none", "level": 0, "filter": "none"}
      for m in ("jpeg", "webp") for q in (90, 50)),
]
#: fidelity metrics a floor may be stated in, and the probe column each one reads
METRICS = {"top1_agree": "top1_agree", "cosine": "cosine_min"}
DEFAULT_FLOOR = {"metric": "top1_agree", "min": 0.99}


def parse_floor(floor: Any) -> dict:
    """``{"metric", "min"}`` from the ``floor`` param (a number means top-1 agreement)."""
    if floor is None:
        return dict(DEFAULT_FLOOR)
    if isinstance(floor, int | float) and not isinstance(floor, bool):
        floor = {"metric": "top1_agree", "min": floor}
    if not isinstance(floor, dict) or set(floor) - {"metric", "min"}:
        raise TracrError(f"split-codec: floor must be {{metric, min}}, not {floor!r}",
                         hint='e.g. {metric: top1_agree, min: 0.99} or {metric: cosine, min: 0.999}')
    metric = floor.get("metric", "top1_agree")
    if metric not in METRICS:
        raise TracrError(f"split-codec: unknown floor metric '{metric}'.",
                         hint=f"The valid options are {sorted(METRICS)}")
    try:
        low = float(floor.get("min", DEFAULT_FLOOR["min"]))
    except (TypeError, ValueError):
        raise TracrError(f"split-codec: floor min must be a number, not {floor.get('min')!r}") from None
    return {"metric": metric, "min": low}


def meets(value: float | None, floor: dict) -> bool:
    """True when a fidelity figure is known and at least the floor's minimum."""
    return value is not None and float(value) >= floor["min"]


def far_side_factor(ctx: PartitionContext) -> dict | None:
    """How long the cloud takes per ms of the head's CPU time: the cloud's whole-pass wall
    time (``full_ms``) over the edge's whole-pass CPU time (``full_cpu_ms``), both from the
    start-up profiles; None when either is missing (older participants).

    The probe decodes on the head. Its CPU time there is the work; the head's wall time
    adds the head's own pace (at 0.25 core under the lab's pacer, about four times the CPU
    time), which the cloud, decoding in the run, does not pay."""
    cloud = (ctx.cloud_profile or {}).get("full_ms")
    edge_cpu = (ctx.edge_profile or {}).get("full_cpu_ms")
    try:
        cloud, edge_cpu = float(cloud), float(edge_cpu)
    except (TypeError, ValueError):
        return None
    if not (cloud > 0 and edge_cpu > 0):
        return None
    return {"factor": cloud / edge_cpu, "cloud_full_ms": cloud, "edge_full_cpu_ms": edge_cpu}


@register_partitioner("split-codec")
class SplitCodec(Partitioner):
    """The fastest predicted (split, transport) pair whose probed fidelity meets a floor.

    Params: ``transports`` (a list of transport settings, as cyclic's: each like the
    manifest's ``transport`` section plus an optional ``splits`` list; default
    :data:`DEFAULT_TRANSPORTS`); ``floor`` (``{metric: top1_agree | cosine, min}``,
    default top-1 agreement >= 0.99; ``cosine`` is the probe's minimum cosine);
    ``splits`` (``"all"`` or a list) restricts the cuts; ``probe_items`` (default 2)
    inputs and ``probe_splits`` (an int: at most that many cuts, evenly spread, for big
    models) size the start-up probe; ``bandwidth_Bps`` / ``rtt_ms`` override the probed
    link for a what-if; ``include_rtt``, ``source``, ``calibrate``, ``throttle`` and
    ``cold`` are predicted-argmin's. When no pair meets the floor it says so and falls
    back to the fastest lossless pair. After :meth:`next_split`, :attr:`transport` is the
    chosen pair's ``CodecConfig``, which the head sends the crossing tensors with.
    """

    needs = frozenset({"edge_profile", "cloud_profile", "network", "fidelity"})

    def __init__(self, transports: list | None = None, floor: Any = None,
                 splits: Any = "all", probe_items: int = 2, probe_splits: int | None = None,
                 include_rtt: bool = True, **params: Any) -> None:
        super().__init__(floor=parse_floor(floor), splits=splits, probe_items=probe_items,
                         include_rtt=include_rtt, **params)
        if transports is not None:
            self.params["transports"] = transports
        if probe_splits is not None:
            self.params["probe_splits"] = int(probe_splits)
        self.floor = self.params["floor"]
        self.transports = parse_transports(DEFAULT_TRANSPORTS if transports is None else transports)
        if not self.transports:
            raise TracrError("split-codec: transports is empty", hint="name at least one")
        if int(probe_items) < 1:
            raise TracrError(f"split-codec: probe_items must be >= 1, got {probe_items}")
        self.include_rtt = bool(include_rtt)
        #: the CodecConfig of the chosen pair (set by setup)
        self.transport: Any = None
        self.k: int | None = None
        self._decision: dict = {}

    def probe_request(self) -> dict:
        """What the head's start-up probe must cover for this policy (plain JSON)."""
        return {"transports": [{**d, **({"splits": only} if only is not None else {})}
                               for d, only, _ in self.transports],
                "splits": self.params.get("splits", "all"),
                "items": int(self.params.get("probe_items", 2)),
                "max_splits": self.params.get("probe_splits")}

    def setup(self, ctx: PartitionContext) -> None:
        """Predict every probed pair at an allowed split, keep the fastest above the floor."""
        super().setup(ctx)
        probe = ctx.fidelity or {}
        if not probe.get("pairs"):
            raise TracrError("split-codec: no fidelity probe in the context.",
                             hint="The head probes each (split, transport) pair at start-up "
                             "when the partitioner needs 'fidelity'; check the edge's log.")
        inner_params = {k: v for k, v in self.params.items()
                        if k in ("source", "calibrate", "throttle", "cold", "bandwidth_Bps",
                                 "rtt_ms", "type_map")}
        inner = PredictedArgmin(include_rtt=self.include_rtt, **inner_params)
        inner.setup(ctx)
        base = inner.decision()
        parts = base["predicted_parts"]
        link = base["link"]
        bw, rtt = float(link["bandwidth_Bps"]), float(link["rtt_ms"])
        wanted = self._allowed(ctx)
        by_label = {cfg.label: cfg for _, _, cfg in self.transports}
        col = METRICS[self.floor["metric"]]
        far = far_side_factor(ctx)
        rows = []
        for p in probe["pairs"]:
            k, label = int(p["split"]), str(p["transport"])
            if k not in parts or k not in wanted or label not in by_label:
                continue
            edge, cloud = parts[k]["edge_ms"], parts[k]["cloud_ms"]
            wire = p["bytes"] / bw * 1e3 + rtt
            dec = p["decode_ms"]
            if far is not None and p.get("decode_cpu_ms") is not None:
                dec = float(p["decode_cpu_ms"]) * far["factor"]
            total = edge + p["encode_ms"] + wire + dec + cloud
            rows.append({"split": k, "transport": label, "predicted_ms": total,
                         "edge_ms": edge, "encode_ms": p["encode_ms"], "transfer_ms": wire,
                         "decode_ms": dec, "decode_probed_ms": p["decode_ms"],
                         "cloud_ms": cloud, "bytes": p["bytes"],
                         "top1_agree": p.get("top1_agree"), "cosine_min": p.get("cosine_min"),
                         "lossless": by_label[label].lossy == "none",
                         "meets_floor": meets(p.get(col), self.floor)})
        if not rows:
            raise TracrError("split-codec: the probe covers none of the allowed pairs.",
                             hint=f"allowed splits {sorted(wanted)}, transports "
                             f"{sorted(by_label)}")
        rows.sort(key=lambda r: (r["predicted_ms"], r["split"], r["transport"]))
        ok = [r for r in rows if r["meets_floor"]]
        notes = []
        if not ok:
            ok = [r for r in rows if r["lossless"]] or rows
            notes.append(f"no probed pair meets {self.floor['metric']} >= {self.floor['min']}; "
                         "fell back to the fastest lossless pair")
        best = ok[0]
        runner = ok[1] if len(ok) > 1 else None
        self.k = best["split"]
        self.transport = by_label[best["transport"]]
        self._decision = {
            "name": self.name,
            "chosen": self.k,
            "transport": best["transport"],
            "transport_config": self.transport.to_dict(),
            "criterion": f"argmin predicted edge + encode + transfer + decode + cloud with "
                         f"{self.floor['metric']} >= {self.floor['min']}",
            "floor": self.floor,
            "chosen_ms": best["predicted_ms"],
            "fidelity": {"top1_agree": best["top1_agree"], "cosine_min": best["cosine_min"],
                         "meets_floor": best["meets_floor"]},
            "runner_up": runner,
            "link": link,
            "decode": ({"from": "the probe's CPU time on the head x cloud full_ms / edge "
                                "full_cpu_ms", **far} if far is not None
                       else {"from": "the probe's wall time on the head"}),
            "probe": {"seconds": probe.get("seconds"), "items": probe.get("items"),
                      "splits": len({r["split"] for r in rows}), "pairs": len(rows)},
            "pairs": rows,
            "notes": notes,
            "params": self.params,
        }

    def _allowed(self, ctx: PartitionContext) -> set[int]:
        splits = self.params.get("splits", "all")
        valid = set(ctx.valid_splits)
        if splits in (None, "all"):
            return valid
        return valid & {int(k) for k in (splits if isinstance(splits, list) else [splits])}

    def next_split(self) -> int:
        """The chosen split, every time; :attr:`transport` stays the chosen pair's."""
        if self.k is None:
            raise TracrError("split-codec: next_split() called before setup().")
        return self.k

    def decision(self) -> dict:
        """Chosen split and transport, predicted ms, the probed fidelity of the choice, the
        runner-up and every candidate pair's prediction."""
        return self._decision or {"name": self.name, "params": self.params, "chosen": None}
