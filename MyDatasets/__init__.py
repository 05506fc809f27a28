"""Datasets: the classes that give a participant its inputs, plus small sample data.

A dataset turns "item i" into a preprocessed tensor of the model's input shape,
an optional label and an item id. Preprocessing (resize, centre crop,
normalise) belongs to the dataset, so every participant that loads the same
item gets bit-identical tensors.

Built-ins:

- ``synthetic``: seeded random inputs of the model's input shape (param ``size``).
- ``image-folder``: a directory of images on the device: flat, one sub-folder
  per class, or a ``filename,label`` labels file.
- ``sample``: the small CC0 image set shipped in ``MyDatasets/sample_images/``.

Your own dataset: put a module in this folder that subclasses :class:`Dataset`
and decorates it with :func:`register_dataset`; it is discovered automatically
(see the worked example on :class:`Dataset`). The base class and the registry
live in :mod:`experiment_design.datasets` and are re-exported here.

This package runs on edge devices: it imports torch, numpy and PIL (lazily),
never ``app_api``, rich, matplotlib or plumbum.
"""

from experiment_design.datasets import (
    Dataset,
    accepted_params,
    create_dataset,
    get_dataset_class,
    list_datasets,
    register_dataset,
    required_params,
)

__all__ = [
    "Dataset",
    "accepted_params",
    "create_dataset",
    "get_dataset_class",
    "list_datasets",
    "register_dataset",
    "required_params",
]
