"""Benchmarks of the test-bed itself: how much tracr perturbs what it measures.

Each module here exposes ``add_arguments(parser)`` (optional) and ``run(args) -> dict``;
the dict is printed as JSON with ``--json``, or as a table otherwise. Targets are
reported as ratios measured side by side in one run, so a noisy machine shifts both
sides of a ratio together.
"""

BENCHMARKS = {
    "overhead": "per-layer timing and suffix-only execution versus plain PyTorch",
    "transport": "participant data path versus a raw TCP socket",
    "deploy": "zero-deploy: time to all participants ready, and teardown time",
    "pipeline": "a pipelined run against its bound, latency mode and the best single device",
    "quota": "how steady one CPU's compute time is, unlimited and under a CPU quota",
    "drift": "how far this machine's speed for the same work moves over minutes, per CPU",
    "preempt": "what an interruption costs a computing thread here, and what pacing costs it",
    "llm": "a token pipeline's time per output token versus transformers' own generate, "
           "and lossy activations' token agreement with the unsplit model",
}
