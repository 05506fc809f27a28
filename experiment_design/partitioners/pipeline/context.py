"""The context a pipeline runner hands over to the planners."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from experiment_design.errors import TracrError
from experiment_design.partitioners.pipeline.facts import DeviceFacts, LinkFacts, ModelFacts


# ----- the context a pipeline runner hands over -------------------------------------------
@dataclass(frozen=True)
class PipelineContext:
    """Everything the planners need, JSON-able so it can cross a control channel:
    the model's facts, each device's facts by name, the directed links and the source."""

    model: ModelFacts
    devices: dict[str, DeviceFacts]
    links: dict[tuple[str, str], LinkFacts]
    source: str

    def to_dict(self) -> dict:
        """``{"model", "devices": [..], "links": [{"from", "to", "bandwidth_Bps",
        "rtt_ms"}, ..], "source"}``."""
        return {
            "model": self.model.to_dict(),
            "devices": [d.to_dict() for d in self.devices.values()],
            "links": [{"from": a, "to": b, **lk.to_dict()} for (a, b), lk in self.links.items()],
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> PipelineContext:
        """Inverse of :meth:`to_dict`. ``model`` may also be ``{"layers": profile rows,
        "points": split points}``; ``devices`` a list or a ``{name: facts}`` mapping."""
        devs = d.get("devices") or []
        rows = ([{**v, "name": k} for k, v in devs.items()] if isinstance(devs, Mapping)
                else list(devs))
        devices = {r["name"]: DeviceFacts.from_dict(r) for r in rows}
        links = {}
        for r in d.get("links") or []:
            if r["from"] not in devices or r["to"] not in devices:
                raise TracrError(f"A link names an unknown device: {r['from']} -> {r['to']}.",
                                 hint=f"Known devices: {sorted(devices)}.")
            links[(r["from"], r["to"])] = LinkFacts(float(r["bandwidth_Bps"]),
                                                    float(r.get("rtt_ms") or 0.0))
        if d.get("source") not in devices:
            raise TracrError(f"The pipeline context's source {d.get('source')!r} is not one "
                             f"of its devices {sorted(devices)}.")
        return cls(ModelFacts.from_dict(d["model"]), devices, links, str(d["source"]))
