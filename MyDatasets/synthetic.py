"""``synthetic``: seeded random inputs of the model's input shape."""

from __future__ import annotations

from experiment_design.datasets import Dataset, Item, register_dataset
from experiment_design.errors import TracrError
from experiment_design.params import Param


@register_dataset("synthetic")
class Synthetic(Dataset):
    """``size`` standard-normal tensors of the model's input shape, no labels.

    Item i depends only on (seed, i), so every participant and every run with
    the same seed sees the same inputs, in any order. Useful for models that
    do not take images, and for timing runs where content does not matter.
    """

    PARAMS = {"size": Param("int", default=8, min=1, doc="how many inputs")}

    def __init__(self, *, input_shape: tuple[int, ...], seed: int = 0, size: int = 8) -> None:
        super().__init__(input_shape=input_shape, seed=seed, size=size)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise TracrError(f"synthetic dataset: size must be a positive int, not {size!r}")
        self.size = size

    def __len__(self) -> int:
        return self.size

    def load(self, i: int) -> Item:
        """Item ``i``: a fresh generator seeded from (seed, i)."""
        import torch

        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        x = torch.randn(self.input_shape, generator=gen, dtype=torch.float32)
        return x, None, f"synthetic-{i:04d}"
