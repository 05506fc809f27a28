"""The cyclic partitioner (the paper's sweep) and the fixed one."""

from __future__ import annotations

from typing import Any

from experiment_design.errors import TracrError
from experiment_design.partitioners.base import (
    PartitionContext,
    Partitioner,
    register_partitioner,
)


@register_partitioner("cyclic")
class CyclicPartitioner(Partitioner):
    """Walk every allowed split point in order, each ``repeats`` times, then wrap around.

    Params: ``repeats`` (int, default 1); ``splits``: ``"all"`` (default) or a
    list of split indices restricting the allowed set (invalid ones are an
    error). One sweep is ``len(allowed) * repeats`` inferences.
    """

    def __init__(self, repeats: int = 1, splits: Any = "all", **params: Any) -> None:
        super().__init__(repeats=repeats, splits=splits, **params)
        if int(repeats) < 1:
            raise TracrError(f"cyclic: repeats must be >= 1, got {repeats}")
        self.repeats = int(repeats)
        self.splits = splits
        self.allowed: list[int] = []
        self._n = 0

    def setup(self, ctx: PartitionContext) -> None:
        """Resolve the allowed split set against the model's valid splits."""
        super().setup(ctx)
        valid = list(ctx.valid_splits)
        if self.splits in (None, "all"):
            self.allowed = valid
        else:
            wanted = [int(s) for s in (self.splits if isinstance(self.splits, list) else [self.splits])]
            bad = [s for s in wanted if s not in valid]
            if bad:
                raise TracrError(
                    f"cyclic: split(s) {bad} are not valid for this model.",
                    hint=f"valid splits are {valid}",
                )
            self.allowed = wanted
        self._n = 0

    def next_split(self) -> int:
        """Current split; advances after ``repeats`` calls and wraps around."""
        k = self.allowed[(self._n // self.repeats) % len(self.allowed)]
        self._n += 1
        return k

    def sweep_length(self) -> int:
        """len(allowed splits) x repeats."""
        return len(self.allowed) * self.repeats

    def decision(self) -> dict:
        """The allowed set, repeats and position in the cycle."""
        return {
            "name": self.name,
            "allowed": self.allowed,
            "repeats": self.repeats,
            "sweep_length": self.sweep_length(),
            "issued": self._n,
        }


@register_partitioner("fixed")
class FixedPartitioner(Partitioner):
    """Always the same split (param ``split``; ``-1`` means the last layer)."""

    def __init__(self, split: int = 0, **params: Any) -> None:
        super().__init__(split=split, **params)
        self.split = int(split)

    def setup(self, ctx: PartitionContext) -> None:
        """Check the split is valid for this model."""
        super().setup(ctx)
        n = len(ctx.points) - 1 if ctx.points else max(ctx.valid_splits)
        if self.split < 0:
            self.split = n + 1 + self.split
        if self.split not in ctx.valid_splits:
            raise TracrError(
                f"fixed: split {self.split} is not valid for this model.",
                hint=f"valid splits are {ctx.valid_splits}",
            )

    def next_split(self) -> int:
        """The configured split."""
        return self.split

    def decision(self) -> dict:
        """The configured split."""
        return {"name": self.name, "chosen": self.split}
