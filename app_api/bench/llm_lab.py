"""`tracr bench llm --placement`: a language model placed over lab hosts by three policies,
each run and measured, tracr's placement planned from figures measured on these hosts.

The lab is the manifest's (default ``llm-placement-lab``: Qwen2.5-0.5B's architecture,
random weights, on three hosts at 0.6 / 0.6 / 0.15 core with memory caps that no single
host can hold the model under). With no lab up, the bench brings up the stated one (as
``tracr lab up --manifest``; root) and takes it down after; a lab that is up is used if
it is the stated one (the run's lab check refuses any other).

1. Measure (:mod:`app_api.bench.llm_hosts`): each host's decode step under its quota and
   cap (per-layer, embedding and LM head ms; the process's own memory), the lab link's
   measured rate and round trip, each host's cap from the lab state.
2. Plan (:mod:`experiment_design.partitioners.llm_placement`, from those figures only):
   memory-proportional, equal slices and tracr's placement.
3. Run each placement (one sequence, ``--tokens`` greedy tokens) through the manifest,
   only its cuts, chain and devices changed; a placement another policy already ran is
   not run twice (``<policy>_same_run_as``). tracr's run then generates ``--in-flight``
   sequences at once on the same stages.

Keys (flat; ``<p>``: ``memory_proportional``, ``equal_slices``, ``tracr``):
``<p>_hosts``, ``<p>_cuts``, ``<p>_predicted_ms_per_token``, ``<p>_tpot_ms_p50`` (time per
output token, p50 over every gap of the run's sequence), ``<p>_tokens_per_s`` (the
sequence's decoded tokens over its decode time) and ``<p>_tokens_per_s_total`` (every token
over the whole generation, prefill included); ``tracr_speedup_over_memory_proportional``
(memory-proportional's TPOT p50 over tracr's; target >= 1.5); ``in_flight_tokens_per_s_total``
(every token of the ``--in-flight`` sequences over the span of their generation, prefills
included), ``in_flight_bound_tokens_per_s`` (1000 / the slowest stage's median compute +
send ms per decode token, measured in that same generation), ``in_flight_over_bound``
(target >= 0.9) and ``in_flight_over_one_sequence`` (over tracr's one-sequence
``tokens_per_s_total``; target >= 1.6).

``--no-caps``: the same lab without its memory caps, where one host can hold the model:
tracr's placement and every host alone, each run; ``single_<host>_tpot_ms_p50`` and
``tracr_over_best_single`` (tracr's TPOT p50 over the fastest single host's; target <= 1.0:
tracr's placement is never slower than the best single device). Where tracr's placement
is one host alone, it is that host's run (the same placement is not run twice). The runs
go in a mirrored order (every host alone, then tracr's placement if it splits; then that
placement again and, in reverse order, each host that came within
:data:`CONTENDER` of the fastest), so that a drift of the machine over the runs moves
every contender's mean alike: ``single_<host>_tpot_ms_runs`` holds each run's TPOT p50 and
``single_<host>_tpot_ms_p50`` their mean; ``run_to_run_pct`` is the largest difference
between a placement's two runs (the measurement's repeatability), and
``best_single_tied`` the hosts whose mean is within it of the fastest's: hosts that these
runs cannot tell apart.

``placement_from``: the measured figures the placement used (``host_<name>_layer_ms`` and
the rest beside it); ``split_margin``: the figures' resolution
(:func:`app_api.bench.llm_hosts.split_resolution`), below which tracr does not split.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from dataclasses import dataclass
from typing import Any

from app_api import lab
from app_api.bench.llm_hosts import (
    HostFacts,
    host_from_probe,
    link_from_report,
    model_facts,
    probe_hosts,
    split_resolution,
)
from app_api.lab.requirement import LabSpec, stated_lab
from experiment_design.errors import TracrError
from experiment_design.models.llm import get_llm_spec
from experiment_design.partitioners.llm_placement import (
    Placement,
    compare,
    time_per_token,
    tracr_placement,
)

SPEEDUP = 1.5
OVER_BOUND = 0.9
OVER_ONE = 1.6
#: tracr's TPOT over the best single host's, at most
OVER_SINGLE = 1.0
#: a host alone whose first run is within this factor of the fastest's runs again
CONTENDER = 1.25
POLICIES = {"memory-proportional": "memory_proportional", "equal-slices": "equal_slices",
            "tracr": "tracr"}


@dataclass(frozen=True)
class Generation:
    """What one generation of a run measured (``summary.json``'s ``llm`` figures)."""

    tpot_ms_p50: float
    tokens_per_s: float | None
    tokens_per_s_total: float | None
    ttft_ms: float | None
    #: per stage, in chain order: (instance, compute ms per decode token, send ms)
    stages: tuple[tuple[str, float, float], ...]

    @classmethod
    def from_figures(cls, g: dict) -> Generation:
        """From a generation's figures (:func:`experiment_design.runtime.generation.summarize`)."""
        stages = tuple((str(s.get("instance")), float(s.get("compute_ms_per_token") or 0.0),
                        float(s.get("send_ms_per_token") or 0.0))
                       for s in g.get("stages") or [])
        return cls(float(g["tpot_ms_p50"]), g.get("tokens_per_s_per_sequence"),
                   g.get("tokens_per_s_total"), g.get("ttft_ms"), stages)

    @property
    def slowest(self) -> tuple[str, float]:
        """The slowest stage and its ms per decode token (compute + send)."""
        inst, c, s = max(self.stages, key=lambda r: r[1] + r[2])
        return inst, c + s

    @property
    def bound_per_s(self) -> float:
        """The pipeline's bound: 1 / the slowest stage's time per token."""
        return 1000.0 / self.slowest[1]


@dataclass(frozen=True)
class Measured:
    """A placement's run: its generation(s) and where it was written."""

    placement: Placement
    one: Generation
    run_dir: str
    in_flight: Generation | None = None
    same_run_as: str | None = None
    #: a second run of the same placement (``--no-caps``: the mirrored order)
    again: Generation | None = None

    @property
    def tpot_ms_runs(self) -> list[float]:
        """Each run's TPOT p50."""
        return [g.tpot_ms_p50 for g in (self.one, self.again) if g is not None]

    @property
    def tpot_ms(self) -> float:
        """The mean of :attr:`tpot_ms_runs`."""
        return sum(self.tpot_ms_runs) / len(self.tpot_ms_runs)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of the placement mode (``tracr bench llm --placement``)."""
    p.add_argument("--placement", action="store_true",
                   help="place the model over the manifest's lab hosts by three policies, "
                        "run and measure each (needs root and the llm extra)")
    p.add_argument("--manifest", default="llm-placement-lab",
                   help="the lab manifest of --placement (default llm-placement-lab)")
    p.add_argument("--no-caps", action="store_true",
                   help="with --placement: the lab without memory caps; tracr's placement "
                        "against every host alone")
    p.add_argument("--in-flight", type=int, default=4,
                   help="with --placement: sequences in flight on tracr's placement")
    p.add_argument("--probe-layers", type=int, default=2,
                   help="with --placement: decoder layers each host's decode probe times")
    p.add_argument("--context", type=int, default=512,
                   help="with --placement: the probe's KV context and the placement's "
                        "(tokens)")


def placement_overrides(p: Placement, chain: list[str], generations: list[dict]) -> list[str]:
    """The manifest overrides that run placement ``p`` over the manifest's ``chain``
    members (the first one the head): its hosts as their devices in chain order, the
    members it leaves out removed (one host: no chain), and the head's playbook: each of ``generations``
    (``generate`` params) with ``p``'s cuts, then ``finish``."""
    if len(p.stages) > len(chain):
        raise ValueError(f"{len(p.stages)} stages, the manifest's chain has {len(chain)}")
    used = chain[:len(p.stages)]
    out = [f"participant_instances.{m}.device={h}" for m, h in zip(used, p.hosts, strict=True)]
    for m in chain[len(p.stages):]:
        out += [f"~participant_instances.{m}", f"~playbook.{m}"]
    # one host alone runs the model as the head alone: no chain (a chain has two members)
    out.append(f"pipeline.chain=[{', '.join(used)}]" if len(used) > 1 else "~pipeline")
    cuts = "[" + ", ".join(str(c) for c in p.cuts) + "]"
    tasks = []
    for g in generations:
        params = ", ".join(f"{k}: {v}" for k, v in {**g, "cuts": cuts}.items())
        tasks.append(f"{{task: generate, params: {{{params}}}}}")
    out.append(f"playbook.{chain[0]}=[{', '.join([*tasks, '{task: finish}'])}]")
    return out


def _fmt(p: Placement) -> str:
    return ", ".join(f"{s.host} {s.a + 1}..{s.b}" for s in p.stages)


def placement_keys(prefix: str, m: Measured) -> dict[str, Any]:
    """One placement's flat keys (the module docstring)."""
    return {f"{prefix}_hosts": m.placement.hosts, f"{prefix}_cuts": m.placement.cuts,
            f"{prefix}_layers": _fmt(m.placement),
            f"{prefix}_predicted_ms_per_token": round(m.placement.ms_per_token, 2),
            f"{prefix}_tpot_ms_p50": m.one.tpot_ms_p50,
            f"{prefix}_tokens_per_s": m.one.tokens_per_s,
            f"{prefix}_tokens_per_s_total": m.one.tokens_per_s_total,
            f"{prefix}_ttft_ms": m.one.ttft_ms,
            f"{prefix}_run_dir": m.run_dir,
            **({f"{prefix}_same_run_as": m.same_run_as} if m.same_run_as else {})}


def facts_keys(hosts: list[HostFacts], link: Any, context: int) -> dict[str, Any]:
    """The measured figures the placement used, flat."""
    out: dict[str, Any] = {
        "placement_from": (f"measured: each host's decode step under its quota and cap "
                           f"(probe of {hosts[0].probe.layers_probed} layers, "
                           f"{hosts[0].probe.context_tokens}-token KV context), the lab "
                           "link's measured rate and round trip, the lab's memory caps"),
        "link_rate_Bps": link.rate_bytes_per_s, "link_rtt_ms": link.rtt_ms,
        "context_tokens": context}
    for h in hosts:
        for k, v in h.to_dict().items():
            if k != "name":
                out[f"host_{h.name}_{k}"] = v
    return out


def caps_result(measured: dict[str, Measured]) -> dict[str, Any]:
    """The figures, targets and verdicts of the capped lab (three policies, tracr's in
    flight); ``measured`` by policy name."""
    out: dict[str, Any] = {}
    for policy, prefix in POLICIES.items():
        out.update(placement_keys(prefix, measured[policy]))
    t, mp = measured["tracr"], measured["memory-proportional"]
    out["tracr_reason"] = t.placement.reason
    out["tracr_speedup_over_memory_proportional"] = mp.one.tpot_ms_p50 / t.one.tpot_ms_p50
    targets = {"tracr_speedup_over_memory_proportional": f">= {SPEEDUP}"}
    met = {"tracr_speedup_over_memory_proportional":
           out["tracr_speedup_over_memory_proportional"] >= SPEEDUP}
    g = t.in_flight
    if g is not None:
        slow, ms = g.slowest
        total = g.tokens_per_s_total or 0.0
        out.update({
            "in_flight_tokens_per_s_total": total,
            "in_flight_tpot_ms_p50": g.tpot_ms_p50,
            "in_flight_bound_tokens_per_s": g.bound_per_s,
            "in_flight_slowest_stage": slow, "in_flight_slowest_stage_ms": ms,
            "in_flight_stage_ms": {i: round(c + s, 2) for i, c, s in g.stages},
            "in_flight_over_bound": total / g.bound_per_s,
            "in_flight_over_one_sequence": total / (t.one.tokens_per_s_total or float("inf")),
        })
        targets.update(in_flight_over_bound=f">= {OVER_BOUND}",
                       in_flight_over_one_sequence=f">= {OVER_ONE}")
        met.update(in_flight_over_bound=out["in_flight_over_bound"] >= OVER_BOUND,
                   in_flight_over_one_sequence=out["in_flight_over_one_sequence"] >= OVER_ONE)
    return {**out, "targets": targets, "met": met}


def single_result(tracr: Measured, singles: dict[str, Measured]) -> dict[str, Any]:
    """The figures, target and verdict of the uncapped lab: tracr's placement against
    each host alone (``singles`` by host); a placement run twice counts the mean of its
    two runs (the module docstring)."""
    out: dict[str, Any] = {**placement_keys("tracr", tracr), "tracr_reason": tracr.placement.reason}
    for host, m in singles.items():
        out.update(placement_keys(f"single_{host}", m))
    for prefix, m in (("tracr", tracr), *((f"single_{h}", m) for h, m in singles.items())):
        out[f"{prefix}_tpot_ms_runs"] = m.tpot_ms_runs
        out[f"{prefix}_tpot_ms_p50"] = m.tpot_ms
    best = min(singles, key=lambda h: singles[h].tpot_ms)
    twice = [m.tpot_ms_runs for m in (tracr, *singles.values()) if m.again is not None]
    noise = max((abs(a - b) / ((a + b) / 2) for a, b in twice), default=None)
    out["best_single_host"] = best
    out["tracr_over_best_single"] = tracr.tpot_ms / singles[best].tpot_ms
    if noise is not None:
        out["run_to_run_pct"] = 100 * noise
        out["best_single_tied"] = sorted(
            h for h, m in singles.items() if m.tpot_ms <= singles[best].tpot_ms * (1 + noise))
    return {**out, "targets": {"tracr_over_best_single": f"<= {OVER_SINGLE}"},
            "met": {"tracr_over_best_single": out["tracr_over_best_single"] <= OVER_SINGLE}}


def _chain(manifest: str) -> list[str]:
    """The manifest file's ``pipeline.chain`` (read before validation: its lab devices
    exist only once its lab is up)."""
    # the manifest package loads PyYAML: not at tracr --help, which imports this module
    from app_api.manifest import find_manifest
    from app_api.manifest.yamlio import load_yaml_file

    data, _ = load_yaml_file(find_manifest(manifest))
    return list(((data or {}).get("pipeline") or {}).get("chain") or [])


def _run(args: argparse.Namespace, p: Placement, generations: list[dict],
         extra: list[str]) -> tuple[list[Generation], str]:
    """One run of the manifest with placement ``p``: its generations' figures."""
    # the manifest package and the runner load PyYAML, torch: not at tracr --help
    from app_api.manifest import load_manifest
    from app_api.runner.labfacts import lab_facts
    from app_api.runner.observer import Observer

    overrides = [*placement_overrides(p, _chain(args.manifest), generations), *extra]
    manifest = load_manifest(args.manifest, overrides)
    out = tempfile.mkdtemp(prefix="tracr-bench-llm-")
    res = Observer(manifest, out_dir=out, progress=False, facts=lab_facts(manifest)).run()
    g = (res.summary or {}).get("llm")
    if not res.ok or not g:
        raise TracrError(f"the run of {p.policy}'s placement ({_fmt(p)}) failed: "
                         + "; ".join(res.errors or ["no generation reported"]),
                         hint=f"see {res.run_dir}")
    gens = [g, *(g.get("more") or [])]
    return [Generation.from_figures(x) for x in gens], str(res.run_dir)


def _measure(args: argparse.Namespace, p: Placement, done: dict[str, Measured],
             extra: list[str], in_flight: bool = False) -> Measured:
    """Run ``p`` (one sequence; then ``--in-flight`` at once if ``in_flight``), or reuse
    the run of an identical placement in ``done``."""
    for name, m in done.items():
        if (m.placement.hosts, m.placement.cuts) == (p.hosts, p.cuts) and (
                m.in_flight is not None or not in_flight):
            return dataclasses.replace(m, placement=p, same_run_as=name)
    one = _one_sequence(args)
    gens = [one]
    if in_flight:
        gens.append({**one, "sequences": args.in_flight, "in_flight": args.in_flight,
                     "warmup": 0})
    figures, run_dir = _run(args, p, gens, extra)
    return Measured(p, figures[0], run_dir, figures[1] if in_flight else None)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The placement mode (module docstring): measure, plan, run, compare."""
    name, section, network = stated_lab(args.manifest)
    spec = LabSpec.from_section(section)
    if spec is None:
        raise TracrError(f"{name} states no lab", hint="--placement needs a lab manifest")
    extra = ["~lab.memory"] if args.no_caps else []
    if args.no_caps:
        spec = dataclasses.replace(spec, memory={})
    brought_up = not lab.load_state()
    if brought_up:
        lab.up(**spec.up_kwargs(network))
    try:
        return _placed(args, extra)
    finally:
        if brought_up:
            lab.down()


def _placed(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    from app_api.manifest import load_manifest  # loads PyYAML: not at tracr --help

    model = str(load_manifest(args.manifest, extra).model["name"])
    state = lab.load_state() or {}
    facts = probe_hosts(state, model, layers=args.probe_layers, context=args.context,
                        seed=0)
    mf = model_facts(model)
    hosts = [host_from_probe(f, mf.n) for f in facts]
    link = link_from_report(lab.link_report())
    margin = split_resolution(facts)
    head = {"model": model, "weights": "pretrained" if get_llm_spec(model).pretrained else "random",
            "tokens": args.tokens, "mode": "no-caps" if args.no_caps else "caps",
            "lab_cpu": {h.name: h.cpu_quota for h in facts},
            "lab_memory_bytes": {h.name: h.cap_bytes for h in facts},
            **facts_keys(facts, link, args.context), "split_margin": margin}
    done: dict[str, Measured] = {}
    if args.no_caps:
        t = tracr_placement(mf, hosts, link, context_tokens=args.context, split_margin=margin)
        result = single_result(*_mirrored(args, t, hosts, mf, link, extra))
    else:
        plans = compare(mf, hosts, link, context_tokens=args.context)
        plans["tracr"] = tracr_placement(mf, hosts, link, context_tokens=args.context,
                                         split_margin=margin)
        for policy in ("memory-proportional", "equal-slices", "tracr"):
            done[POLICIES[policy]] = _measure(args, plans[policy], done, extra,
                                              in_flight=policy == "tracr")
        result = caps_result({k: done[v] for k, v in POLICIES.items()})
    result = {**head, **result}
    result["exit_code"] = 0 if all(result["met"].values()) else 1
    return result


def _mirrored(args: argparse.Namespace, t: Placement, hosts: list, mf: Any, link: Any,
              extra: list[str]) -> tuple[Measured, dict[str, Measured]]:
    """``--no-caps``'s runs in the mirrored order (the module docstring): tracr's placement
    and each host alone, by host."""
    done: dict[str, Measured] = {}
    singles: dict[str, Measured] = {}
    for h in hosts:
        p = time_per_token(mf, [h], [0, mf.n], link, policy=f"single {h.name}",
                           context_tokens=args.context)
        singles[h.name] = done[f"single_{h.name}"] = _measure(args, p, done, extra)
    tracr = _measure(args, t, done, extra)
    if tracr.same_run_as is None:
        tracr = _again(args, tracr, extra)
    fastest = min(m.one.tpot_ms_p50 for m in (tracr, *singles.values()))
    for name in reversed(list(singles)):
        if singles[name].one.tpot_ms_p50 <= CONTENDER * fastest:
            singles[name] = _again(args, singles[name], extra)
    if tracr.same_run_as is not None:
        tracr = dataclasses.replace(singles[tracr.same_run_as.removeprefix("single_")],
                                    placement=t, same_run_as=tracr.same_run_as)
    return tracr, singles


def _again(args: argparse.Namespace, m: Measured, extra: list[str]) -> Measured:
    """``m`` with a second run of its placement."""
    gens, _ = _run(args, m.placement, [_one_sequence(args)], extra)
    return dataclasses.replace(m, again=gens[0])


def _one_sequence(args: argparse.Namespace) -> dict[str, Any]:
    """The ``generate`` params of one sequence of ``--tokens`` tokens."""
    return {"max_new_tokens": args.tokens, "prompt_tokens": 16, "sequences": 1, "in_flight": 1}
