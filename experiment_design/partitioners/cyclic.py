"""The cyclic partitioner (the paper's sweep) and the fixed one."""

from __future__ import annotations

import statistics
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
    error); ``refine`` (int, default 0) and ``contenders`` (int, default 8): after
    the walk, the ``contenders`` splits with the lowest measured median end-to-end
    latency get ``refine`` more inferences each, in turn (k1, k2, ..., k1, k2, ...).
    A sweep's best split is the minimum of many noisy medians, so it is biased low
    and unstable when several splits are close; measuring the close ones more
    is where extra repeats pay (racing). One sweep is
    ``len(allowed) * repeats + min(contenders, len(allowed)) * refine`` inferences.
    """

    def __init__(self, repeats: int = 1, splits: Any = "all", refine: int = 0,
                 contenders: int = 8, **params: Any) -> None:
        super().__init__(repeats=repeats, splits=splits, refine=refine, contenders=contenders,
                         **params)
        if int(repeats) < 1:
            raise TracrError(f"cyclic: repeats must be >= 1, got {repeats}")
        if int(refine) < 0 or int(contenders) < 1:
            raise TracrError(f"cyclic: refine must be >= 0 and contenders >= 1, got "
                             f"refine={refine}, contenders={contenders}")
        self.repeats = int(repeats)
        self.refine = int(refine)
        self.n_contenders = int(contenders)
        self.splits = splits
        self.allowed: list[int] = []
        self.contenders: list[int] = []
        self.e2e: dict[int, list[float]] = {}
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
        self.contenders, self.e2e, self._n = [], {}, 0

    def _walk(self) -> int:
        return len(self.allowed) * self.repeats

    def _n_refine(self) -> int:
        return min(self.n_contenders, len(self.allowed)) * self.refine

    def observe(self, split: int, row: dict) -> None:
        """Keep each split's end-to-end latencies (failed inferences are not kept)."""
        if not row.get("error") and row.get("e2e_ms") is not None:
            self.e2e.setdefault(int(split), []).append(float(row["e2e_ms"]))

    def _pick_contenders(self) -> list[int]:
        """The allowed splits with the lowest median e2e so far (unmeasured ones last)."""
        def key(k: int) -> tuple[float, int]:
            v = self.e2e.get(k)
            return (statistics.median(v) if v else float("inf"), k)

        return sorted(self.allowed, key=key)[: min(self.n_contenders, len(self.allowed))]

    def next_split(self) -> int:
        """The walk (each allowed split ``repeats`` times), then the refine rounds over the
        contenders; wraps around after a whole sweep."""
        i = self._n % self.sweep_length()
        self._n += 1
        if i < self._walk():
            return self.allowed[i // self.repeats]
        if i == self._walk():
            self.contenders = self._pick_contenders()
        j = i - self._walk()
        return self.contenders[j % len(self.contenders)]

    def sweep_length(self) -> int:
        """len(allowed splits) x repeats, plus the refine rounds."""
        return self._walk() + self._n_refine()

    def decision(self) -> dict:
        """The allowed set, repeats, the refined contenders and position in the cycle."""
        out = {
            "name": self.name,
            "allowed": self.allowed,
            "repeats": self.repeats,
            "sweep_length": self.sweep_length(),
            "issued": self._n,
        }
        if self.refine:
            out.update(refine=self.refine, contenders=self.contenders)
        return out


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
