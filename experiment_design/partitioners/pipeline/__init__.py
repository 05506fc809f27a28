"""Placement planning for pipelines over k >= 2 devices: pure functions, no runtime.

A pipeline is a chain of stages. Stage 1 runs on the **source**, the device that
holds the inputs; stage i runs the contiguous layers ``first..last`` on its own
device (cut ``a = first - 1`` before it, cut ``b = last`` after it) and sends the
tensors of cut ``b`` straight to stage i+1; the last stage sends the model's
output back to the source. Each device takes part at most once.

**The source's stage may be empty** (``Stage(source, 1, 0)``): the source only
sends the raw input (cut 0) on and receives the output. Every other stage runs
at least one layer. So the single-device placements are the source running
everything (one stage) and the source forwarding the input to one device that
runs everything (two stages, the first empty).

**Cost model.** For stage i on device d_i running layers a_i+1..b_i::

    compute_i  = sum of d_i's layer_ms over a_i+1..b_i
    overhead_i = d_i's overhead_ms (receiving, relaying the reply, the stage's
                 threads) + d_i's byte_ms * (bytes it receives + bytes it sends),
                 when the plan has two or more stages
    transfer_i = crossing_bytes[b_i] / bandwidth(d_i, d_i+1) + rtt(d_i, d_i+1) / 2
                 (the last stage: output_bytes over the link back to the source;
                 nothing when the last stage is the source itself)
    stage_i    = max(compute_i + overhead_i, transfer_i)   throughput objective
               = compute_i + overhead_i + transfer_i        latency objective

    bottleneck = max_i stage_i          throughput = 1000 / bottleneck  (passes/s)
    latency    = sum_i (compute_i + overhead_i + transfer_i)  (one pass alone)

Devices that share a machine's CPUs under quotas (lab hosts) have their sustained times
for every one of them busy; for the throughput objective a stage's compute and overhead
are divided by its gain from the others' idle time (:func:`contention_gains`, solved
with the bottleneck as a fixed point).

With passes in flight a stage sends on its own thread while it computes the next
pass, so its period is the slower of its CPU work and its outgoing transfer; one
pass at a time, a stage computes, then sends (:func:`stage_time`). A receive is
charged to the receiver through its overhead. Measured in a 3-host lab (AlexNet,
0.6 core, 32 MB/s): the head ran layers 1..13 and sent 37 KB (1.2 ms on the wire)
every 18.9-22.9 ms in eight runs, where the sum predicted 23.3-24.5 ms. The overlap
needs the CPU a byte really costs: the link probe's 0.5-1.5 ns/B made cuts with 300
KB crossing look free, and they ran 46-56/s against 71-73/s predicted; the overhead
probe now fits it on the chain (3.5-4.9 ns/B, ``EdgeRole.probe_overhead``).

The throughput is the bound of a pipeline with enough passes in flight; a pass is
one batch of ``ModelFacts.batch`` samples (``layer_ms`` and the byte counts must be for that
batch). Memory: the ``param_bytes`` of a stage's layers must fit its device's
``memory_bytes`` (None = unlimited); activations are not counted.

**Boundaries.** Only valid cuts (``ModelFacts.valid``) separate two stages: an
interior cut 0 < b < n, or cut 0 when the source's stage is empty. Cut n is never
a boundary (the output always goes back to the source).

**Algorithms.** :func:`plan_pipeline` is a dynamic program in the style of
PipeEdge over states (layers done, set of devices used, device of the next
stage): exact for both objectives, exponential in the number of devices
(``MAX_DEVICES``), quadratic in the number of valid cuts. For throughput it
first finds the smallest bottleneck, then, among the plans that reach it, the one
with the least sum of squared stage times (the most room on the other stages). It
never returns a plan that loses to the best single device.
:func:`enumerate_placements` is the exhaustive sweep of one fixed device chain
(the oracle), :func:`proportional_placement` a naive baseline (layers shared in
proportion to memory). ``pipeline-dp`` and ``exhaustive``
(``pipeline_partitioners``) expose them through the partitioner registry.

**The package.** ``facts`` (what is known of devices, links and the model),
``placement`` (stages, a placement's predicted times, contention, comparing two),
``search`` (the dynamic program), ``scoring`` (a given placement, the exhaustive sweep,
the proportional baseline) and ``context`` (what a runner hands over); every public
name is importable from here.
"""

from __future__ import annotations

from experiment_design.partitioners.pipeline.context import PipelineContext
from experiment_design.partitioners.pipeline.facts import (
    DeviceFacts,
    LinkFacts,
    Links,
    ModelFacts,
    full_mesh,
)
from experiment_design.partitioners.pipeline.placement import (
    OBJECTIVES,
    REL_TOL,
    Placement,
    Stage,
    best_of,
    better,
    check_objective,
    contention_gains,
    stage_time,
)
from experiment_design.partitioners.pipeline.scoring import (
    chain_stages,
    count_placements,
    enumerate_placements,
    fits_memory,
    predict,
    proportional_placement,
)
from experiment_design.partitioners.pipeline.search import MAX_DEVICES, plan_pipeline

__all__ = [
    "MAX_DEVICES", "OBJECTIVES", "REL_TOL", "DeviceFacts", "LinkFacts", "Links", "ModelFacts",
    "PipelineContext", "Placement", "Stage", "best_of", "better", "chain_stages",
    "check_objective", "contention_gains", "count_placements", "enumerate_placements",
    "fits_memory", "full_mesh", "plan_pipeline", "predict", "proportional_placement",
    "stage_time",
]
