"""Command groups of the ``tracr`` command.

Each module exposes ``register(subparsers)``. Modules here import only the
standard library at top level, so ``tracr --help`` stays instant; heavy
imports (torch, matplotlib, rich) happen inside the command handlers.
"""

GROUPS = ("model", "experiment", "results", "device", "lab", "bench")
