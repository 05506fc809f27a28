"""Partitioners: policies that pick the split point per inference.

Every module in this package is imported on first use of the registry, so a
new file with an ``@register_partitioner`` class is picked up by name.
"""

from __future__ import annotations

from experiment_design.partitioners.base import (
    PARTITIONERS,
    PartitionContext,
    Partitioner,
    create_partitioner,
    get_partitioner,
    list_partitioners,
    register_partitioner,
)

__all__ = [
    "PARTITIONERS",
    "PartitionContext",
    "Partitioner",
    "create_partitioner",
    "discover",
    "get_partitioner",
    "list_partitioners",
    "register_partitioner",
]


def discover() -> list[str]:
    """Import every module of this package not yet imported (fills the registry)."""
    return PARTITIONERS.discover()
