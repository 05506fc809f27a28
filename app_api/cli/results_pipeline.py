"""A chain's configurations and stages in ``tracr results show`` (and after a run).

The configurations measured (throughput against its bound and the prediction), the ratios
the run reports, and the chosen configuration's stages, planned and measured. rich is
imported inside the functions, for start-up time (:mod:`app_api.cli`).
"""

from __future__ import annotations

from app_api.cli.cells import fixed, nbytes
from app_api.results.store import config_label
from experiment_design.partitioners.pipeline import stage_time

MAX_CONFIGS = 20  # more (a sweep): `results show` lists the fastest and the baselines


def chain_label(c: dict) -> str:
    """``edge-1>stage-1>cloud-1``."""
    return ">".join(c.get("chain") or [])


def planned_stages(summary: dict, config: dict) -> list[dict]:
    """The chosen configuration's stages with the plan's per-stage figures: recorded on the
    stages, else (runs recorded before they were) from the decision that planned it."""
    stages = [dict(s) for s in config.get("stages") or []]
    if not stages or any("predicted_stage_ms" in s for s in stages):
        return stages
    for part in (summary.get("partitioner") or {}).values():
        plan = (((part or {}).get("decision") or {}).get("placement")) if isinstance(
            part, dict) else None
        if not plan or list(plan.get("cuts") or []) != list(config.get("cuts") or []) or \
                list(plan.get("chain") or []) != list(config.get("chain") or []):
            continue
        compute = plan.get("compute_ms") or []
        overhead = plan.get("overhead_ms") or [0.0] * len(compute)
        transfer = plan.get("transfer_ms") or []
        if not len(compute) == len(overhead) == len(transfer) == len(stages):
            continue

        pipelined = plan.get("objective") == "throughput"
        for st, c, o, x in zip(stages, compute, overhead, transfer, strict=True):
            st.update(predicted_compute_ms=c, predicted_overhead_ms=o,
                      predicted_stage_ms=stage_time(c, o, x, pipelined))
    return stages


def print_pipeline(console, summary: dict) -> None:
    """A chain's configurations (throughput against its bound and the prediction), the
    ratios the run reports, and the chosen configuration's stages, planned and measured."""
    pipe = summary.get("pipeline") or {}
    configs = pipe.get("configs") or []
    if not configs:
        return
    from rich.table import Table

    chosen = pipe.get("chosen") or {}

    def is_chosen(c: dict) -> bool:
        return bool(chosen) and all(c.get(k) == chosen.get(k) for k in ("cuts", "chain", "mode"))

    t = Table(title="pipeline configurations (bound = 1 / slowest stage's compute + "
                    "outgoing transfer, from this run)")
    for col in ("cuts", "chain", "mode", "in flight", "n", "inf/s", "bound/s",
                "predicted/s", "p50 ms", "p95 ms", "bytes/inf"):
        t.add_column(col, justify="left" if col in ("chain", "mode") else "right",
                     min_width=max(len(chain_label(c)) for c in configs) if col == "chain"
                     else None)
    shown = configs
    if len(configs) > MAX_CONFIGS:  # a sweep: the chosen, the fastest and the baselines
        fastest = sorted((c for c in configs if c.get("mode") != "single"),
                         key=lambda c: -(c.get("throughput_per_s") or 0.0))[:5]
        keep = {id(c) for c in fastest} | {id(c) for c in configs
                                           if is_chosen(c) or c.get("mode") == "single"}
        shown = [c for c in configs if id(c) in keep]
    for c in shown:
        mark = is_chosen(c)
        n = str(c.get("inferences")) + (f" ({c['errors']} failed)" if c.get("errors") else "")
        t.add_row(config_label(c.get("cuts") or []), chain_label(c),
                  str(c.get("mode")) + (" *" if mark else ""), str(c.get("in_flight", 1)), n,
                  fixed(c.get("throughput_per_s")), fixed(c.get("bound_per_s")),
                  fixed(c.get("predicted_throughput_per_s")), fixed(c.get("latency_ms_p50")),
                  fixed(c.get("latency_ms_p95")), nbytes(c.get("bytes_per_inference")),
                  style="bold green" if mark else None)
    console.print(t)
    main = next((c for c in configs if is_chosen(c)), None)
    if main:
        console.print("* the configuration the run's ratios are of" + (
            "" if main.get("predicted_throughput_per_s") is not None else
            " (the first measured in throughput mode: no partitioner planned one)"),
            highlight=False, soft_wrap=True)
    if len(shown) < len(configs):
        console.print(f"{len(shown)} of {len(configs)} configurations (the fastest five, the "
                      "chosen, the single devices); all of them: summary.json, configs.csv; "
                      "the front: tracr results pareto", highlight=False, soft_wrap=True)
    ratios = {k: v for k, v in (pipe.get("ratios") or {}).items() if v is not None}
    if ratios:
        names = {"throughput_over_bound": "throughput / bound",
                 "pipelined_over_sequential": "pipelined / same stages one at a time",
                 "pipelined_over_single": f"pipelined / best single ({pipe.get('best_single')})",
                 "predicted_over_measured": "predicted / measured"}
        console.print("  ".join(f"{names.get(k, k)}: {v:.3f}" for k, v in ratios.items()),
                      highlight=False, soft_wrap=True)
    stages = planned_stages(summary, main) if main else []
    if not stages:
        return
    planned = any(st.get("predicted_stage_ms") is not None for st in stages)
    t = Table(title=f"stages of {config_label(main.get('cuts') or [])} on "
                    f"{chain_label(main)} ({main.get('mode')}): measured"
                    + (", and planned" if planned else ""))
    for col in ("stage", "device", "layers", "layers ms", "plan", "cpu ms", "plan beside",
                "xfer ms", "stage ms", "plan", "util", "bubble ms", "queue", "bytes out"):
        t.add_column(col, justify="left" if col in ("device", "layers") else "right")
    for st in stages:
        t.add_row(str(st.get("hop")), str(st.get("instance")),
                  f"{st.get('first')}..{st.get('last')}", fixed(st.get("compute_ms")),
                  fixed(st.get("predicted_compute_ms")), fixed(st.get("cpu_ms")),
                  fixed(st.get("predicted_overhead_ms")), fixed(st.get("transfer_ms")),
                  fixed(st.get("stage_ms")), fixed(st.get("predicted_stage_ms")),
                  fixed(st.get("utilization")), fixed(st.get("bubble_ms"), 1),
                  fixed(st.get("queue_mean")), nbytes(st.get("bytes_out")))
    console.print(t)
    console.print("layers ms: the stage's layers, median wall time (cpu ms: their CPU time); "
                  "plan beside: the CPU the plan gave the stage beside its layers (what it "
                  "receives and sends, its threads) as wall time; xfer: its outgoing transfer "
                  "at the probed link; stage ms = layers + xfer (the bound's terms); its plan: "
                  "the planned period (in throughput mode the slower of the CPU work and the "
                  "transfer, which overlap); the slowest planned stage sets the prediction",
                  highlight=False)
