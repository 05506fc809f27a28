"""What a role feeds its model: the dataset preloaded as batches, or one example input.

torch is imported inside the functions: the observer imports the roles to check a
manifest, and ``tracr`` must start without loading torch.
"""

from __future__ import annotations

from typing import Any

from experiment_design.datasets import create_dataset
from experiment_design.errors import TracrError
from experiment_design.models import example_input, get_model_spec
from experiment_design.protocol import SetupConfig


def preload_inputs(config: SetupConfig) -> list[tuple[Any, Any, str]]:
    """Every item of ``config.dataset`` as ``(batch tensor, label, item name)``, batched by
    ``config.model.batch`` (the last batch padded by cycling), so no I/O happens while
    measuring. A batch's label is the list of its items' labels."""
    import torch

    ds_cfg = config.dataset
    spec = get_model_spec(config.model.name)
    ds = create_dataset(
        ds_cfg.name,
        input_shape=tuple(spec.input_shape),
        seed=int(config.seed),
        **(ds_cfg.params or {}),
    )
    if len(ds) == 0:
        raise TracrError(f"Dataset '{ds_cfg.name}' is empty.")
    batch = int(config.model.batch or 1)
    items = [ds[i] for i in range(len(ds))]
    out = []
    for start in range(0, len(items), batch):
        group = items[start : start + batch]
        while len(group) < batch:  # pad the last batch by cycling
            group.append(items[len(group) % len(items)])
        x = torch.stack([g[0] for g in group]).contiguous()
        label = group[0][1] if batch == 1 else [g[1] for g in group]
        out.append((x, label, "+".join(str(g[2]) for g in group)))
    return out


def example_of(config: SetupConfig) -> Any:
    """One seeded example input of ``config.model`` (a batch of ``model.batch``)."""
    model = config.model
    return example_input(model.name, batch=int(model.batch or 1), seed=int(config.seed))
