"""``measured``: the oracle — the split with the lowest measured median latency.

It reads ``{split: median end-to-end ms}`` from the context (filled from a
sweep) or, with ``results: PATH``, from an earlier run's ``summary.json``
(PATH may be the run directory or the file itself). It is the yardstick the
predicting partitioners are scored against.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from experiment_design.errors import TracrError
from experiment_design.partitioners.base import (
    PartitionContext,
    Partitioner,
    register_partitioner,
)


def load_medians(path: str | Path) -> dict[int, float]:
    """``{split: e2e_ms_median}`` from a run directory or its ``summary.json``."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "summary.json"
    if not p.is_file():
        raise TracrError(
            f"measured: no summary at {p}.",
            hint="Point params.results at a finished sweep's run directory.",
        )
    try:
        summary = json.loads(p.read_text())
        rows = summary["splits"]
        out = {
            int(r["split"]): float(r["e2e_ms_median"])
            for r in rows
            if r.get("e2e_ms_median") is not None
        }
    except (ValueError, KeyError, TypeError) as e:
        raise TracrError(f"measured: {p} is not a sweep summary ({e}).") from None
    if not out:
        raise TracrError(f"measured: {p} has no split with a measured median.")
    return out


def clean_medians(measured: dict | None) -> dict[int, float]:
    """Integer keys, finite float values (JSON turns keys into strings)."""
    out = {}
    for k, v in (measured or {}).items():
        if v is not None and math.isfinite(float(v)):
            out[int(k)] = float(v)
    return out


@register_partitioner("measured")
class MeasuredArgmin(Partitioner):
    """Pick the split with the lowest measured median e2e latency.

    Params: ``results`` — a run directory or ``summary.json`` of an earlier
    sweep to pick from (otherwise the context's ``measured`` medians).
    Only splits valid for the current model are considered.
    """

    needs = frozenset({"measured"})

    def __init__(self, results: str | None = None, **params: Any) -> None:
        super().__init__(results=results, **params)
        self.results = results
        if results:
            self.needs = frozenset()  # it brings its own measurements
        self.k: int | None = None
        self._decision: dict = {}

    def setup(self, ctx: PartitionContext) -> None:
        """Take the argmin over the measured medians of valid splits."""
        super().setup(ctx)
        if self.results:
            medians, src = load_medians(self.results), str(self.results)
        else:
            medians, src = clean_medians(ctx.measured), "context (this run's sweep)"
        valid = set(ctx.valid_splits)
        usable = {k: v for k, v in medians.items() if k in valid}
        if not usable:
            raise TracrError(
                "measured: no measured median for any valid split.",
                hint="Run a cyclic sweep first, or pass params.results=<run dir>.",
            )
        self.k = min(usable, key=lambda k: (usable[k], k))
        skipped = sorted(set(medians) - valid)
        self._decision = {
            "name": self.name,
            "chosen": self.k,
            "criterion": "argmin measured median e2e",
            "params": self.params,
            "source": src,
            "inputs": {"splits_measured": len(usable), "ignored_invalid_splits": skipped},
            "predicted": usable,
            "chosen_ms": usable[self.k],
        }

    def next_split(self) -> int:
        """The chosen split, every time."""
        if self.k is None:
            raise TracrError("measured: next_split() called before setup().")
        return self.k

    def decision(self) -> dict:
        """Chosen split, its measured median, and the medians it chose from."""
        return self._decision or {"name": self.name, "params": self.params, "chosen": None}
