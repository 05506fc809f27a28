"""The :class:`Dataset` base class that every dataset subclasses.

It is defined with the dataset registry in :mod:`experiment_design.datasets`
(the contract participants rely on) and re-exported here, where dataset
authors look for it.
"""

from __future__ import annotations

from experiment_design.datasets import Dataset, Item

__all__ = ["Dataset", "Item"]
