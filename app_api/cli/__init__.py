"""Command groups of the ``tracr`` command.

Each module exposes ``register(subparsers)``. Modules here import only the
standard library at top level, so ``tracr --help`` stays instant; heavy
imports (torch, matplotlib, rich) happen inside the command handlers.
Every group module names its handlers ``cmd_<verb>`` (``cmd_ls``, ``cmd_run``, ...).
"""
