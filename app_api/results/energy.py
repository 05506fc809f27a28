"""Energy beside latency: per split, per partitioner, and their front.

Neurosurgeon chooses its split for latency or for the mobile device's energy; here the
energy of a split is what the participants' collectors measured while its inferences ran
(``summary.json`` ``metrics``, :mod:`app_api.results.metrics`), summed over devices:

- ``energy_by_split``: per collector and split, joules per inference with an interval;
- a scored partitioner's ``energy``: the joules of the split it chose against the most
  frugal split's (``energy_regret``);
- ``tracr results pareto RUN --energy``: the splits no other split beats in both
  latency and energy.
"""

from __future__ import annotations

from typing import Any


def energy_by_split(per: dict[str, dict], devices: dict[str, str] | None = None
                    ) -> dict[str, dict]:
    """Per collector and split, joules per inference summed over the devices that measured
    it there (``participants`` names who read it), with the interval; a split where one of
    them had too few samples is left out. ``label`` is ``estimated`` when any part is.
    Every collector reads a device's energy, so participants on one device (``devices``:
    instance -> device; localhost, a lab on one machine) count once: the first of them."""
    out: dict[str, dict] = {}
    seen: set[tuple[str, str]] = set()
    for inst, m in per.items():
        device = (devices or {}).get(inst) or inst
        for method, splits in (m.get("energy_per_split") or {}).items():
            if (device, method) in seen:
                continue  # another participant on this device read the same energy
            seen.add((device, method))
            for split, fig in splits.items():
                cell = out.setdefault(method, {}).setdefault(split, {
                    "j_per_inference": 0.0, "interval": [0.0, 0.0], "label": "measured",
                    "participants": [], "ok": True})
                if fig.get("status") != "ok":
                    cell["ok"] = False
                    continue
                cell["j_per_inference"] += fig["j_per_inference"]
                cell["interval"] = [cell["interval"][0] + fig["interval"][0],
                                    cell["interval"][1] + fig["interval"][1]]
                cell["participants"].append(inst)
                if fig.get("label") == "estimated":
                    cell["label"] = "estimated"
    clean = {}
    for method, splits in out.items():
        kept = {k: {c: v for c, v in cell.items() if c != "ok"}
                for k, cell in splits.items() if cell["ok"] and cell["participants"]}
        if kept:
            clean[method] = kept
    return clean


def preferred_method(by_split: dict[str, dict]) -> str | None:
    """The collector to score with: a measured one where there is one, else the estimate."""
    measured = [m for m, splits in by_split.items()
                if all(c["label"] == "measured" for c in splits.values())]
    return (measured or sorted(by_split) or [None])[0]


def score_energy(summary: dict) -> None:
    """Add to each scored partitioner (summary ``partitioners``) the energy per inference of
    the split it chose and of the most frugal split measured (Neurosurgeon's second
    objective), with the collector and its label; nothing where no split has a figure."""
    by_split = summary.get("energy_by_split") or {}
    method = preferred_method(by_split)
    if method is None:
        return
    splits = by_split[method]
    frugal = min(splits, key=lambda k: splits[k]["j_per_inference"])
    for ev in (summary.get("partitioners") or {}).values():
        if not isinstance(ev, dict) or ev.get("chosen") is None:
            continue
        mine = splits.get(str(ev["chosen"]))
        ev["energy"] = {
            "method": method, "label": splits[frugal]["label"],
            "chosen_j": mine["j_per_inference"] if mine else None,
            "frugal_split": _split_number(frugal), "frugal_j": splits[frugal]["j_per_inference"],
            "energy_regret": (mine["j_per_inference"] / splits[frugal]["j_per_inference"]
                              if mine and splits[frugal]["j_per_inference"] > 0 else None)}


def energy_front(summary: dict, method: str | None = None) -> dict:
    """Latency against energy per split: every split with both a median end-to-end time and
    an energy figure, and ``front``: those no other split beats in both."""
    by_split = summary.get("energy_by_split") or {}
    method = method or preferred_method(by_split)
    if method is None or method not in by_split:
        return {"method": method, "points": [], "front": [],
                "reason": "no split has an energy figure (each needs 20 samples: more "
                          "inferences per split, or a shorter sampler period)"}
    e = by_split[method]
    pts = [{"split": s["split"], "e2e_ms_median": s["e2e_ms_median"],
            "j_per_inference": e[str(s["split"])]["j_per_inference"],
            "interval": e[str(s["split"])]["interval"], "label": e[str(s["split"])]["label"]}
           for s in summary.get("splits") or []
           if s.get("e2e_ms_median") is not None and str(s["split"]) in e]
    front = [p["split"] for p in pts
             if not any(q["e2e_ms_median"] <= p["e2e_ms_median"]
                        and q["j_per_inference"] <= p["j_per_inference"]
                        and (q["e2e_ms_median"], q["j_per_inference"])
                        != (p["e2e_ms_median"], p["j_per_inference"]) for q in pts)]
    return {"method": method, "points": pts, "front": front}


def energy_front_lines(doc: dict) -> list[str]:
    """``tracr results pareto --energy`` as text: one line per split, the front marked."""
    if not doc["points"]:
        return [doc.get("reason", "no energy figures")]
    lines = [f"latency against energy per inference ({doc['method']}, "
             f"{doc['points'][0]['label']}); * = on the front"]
    for p in sorted(doc["points"], key=lambda p: p["e2e_ms_median"]):
        lo, hi = p["interval"]
        mark = "*" if p["split"] in doc["front"] else " "
        lines.append(f"{mark} split {p['split']:>3}: {p['e2e_ms_median']:9.2f} ms  "
                     f"{p['j_per_inference']:.4g} J [{lo:.4g}, {hi:.4g}]")
    return lines


def _split_number(s: str) -> Any:
    """A split's key as the number it names (keys are strings in JSON)."""
    try:
        return int(s)
    except ValueError:
        return s
