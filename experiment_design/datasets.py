"""Datasets as an extension point: the :class:`Dataset` contract and its registry.

``experiment_design`` owns the contract (what a participant asks of a dataset) and
the registry; the ``MyDatasets`` package holds the datasets themselves and the
sample data. The registry finds them by package name: every module of the
package named :data:`DATASET_PACKAGE` is imported on lookup (see
:class:`experiment_design.registry.Registry`), so a new ``MyDatasets/my_data.py``
with ``@register_dataset("my-data")`` needs no other wiring. ``MyDatasets``
re-exports everything here (``from MyDatasets import Dataset, register_dataset``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from experiment_design.errors import TracrError, UnknownNameError
from experiment_design.params import Param
from experiment_design.registry import Registry

if TYPE_CHECKING:  # torch is imported lazily so that listing datasets stays fast
    from torch import Tensor

#: The package whose modules register datasets (imported by name, never statically).
DATASET_PACKAGE = "MyDatasets"

Item = tuple["Tensor", "int | None", str]


class Dataset:
    """A sequence of model inputs: ``ds[i] -> (tensor, label or None, item id)``.

    Subclasses set ``name`` (done by :func:`register_dataset`), accept their
    parameters as keyword arguments and implement ``__len__`` and ``load(i)``.
    ``load`` returns one preprocessed tensor *without* the batch dimension,
    shaped like ``self.input_shape``. Items are loaded lazily; ``preload()``
    loads them all into memory so that disk reads and JPEG decoding are not
    counted in inference latency (the edge role preloads before measuring).
    Defining ``__getitem__`` instead of ``load`` also works.

    Worked example (save as ``MyDatasets/ramps.py``; it is discovered
    automatically and usable as ``dataset: {name: ramps, params: {size: 4}}``)::

        import torch

        from MyDatasets import Dataset, register_dataset


        @register_dataset("ramps")
        class Ramps(Dataset):
            \"\"\"Item i is a constant image of value i / size, labelled i.\"\"\"

            def __init__(self, *, input_shape, seed=0, size=10):
                super().__init__(input_shape=input_shape, seed=seed)
                self.size = int(size)

            def __len__(self):
                return self.size

            def load(self, i):
                x = torch.full(self.input_shape, i / self.size)
                return x, i, f"ramp-{i:03d}"

    Keyword parameters named in ``__init__`` are the dataset's manifest
    ``params``; the manifest validator rejects any other name (accept
    ``**params`` to take anything).
    """

    name: ClassVar[str] = ""
    #: declared parameters, checked by ``tracr experiment validate`` (experiment_design.params)
    PARAMS: ClassVar[dict[str, Param]] = {}
    #: Class names indexed by label, when the dataset knows them.
    class_names: list[str] | None = None

    def __init__(self, *, input_shape: tuple[int, ...], seed: int = 0, **params: Any) -> None:
        self.input_shape = tuple(int(d) for d in input_shape)
        self.seed = int(seed)
        self.params = dict(params)
        self._cache: list[Item] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A subclass written against the plain sequence protocol keeps working
        # and still gets caching and index checks from the base class.
        if "__getitem__" in cls.__dict__ and "load" not in cls.__dict__:
            cls.load = cls.__dict__["__getitem__"]  # type: ignore[attr-defined]
            cls.__getitem__ = Dataset.__getitem__  # type: ignore[method-assign]

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must implement __len__")

    def load(self, i: int) -> Item:
        """Load and preprocess item ``i`` (0 <= i < len); subclasses implement this."""
        raise NotImplementedError(f"{type(self).__name__} must implement load(i)")

    def __getitem__(self, i: int) -> Item:
        n = len(self)
        if not isinstance(i, int):
            raise TypeError(f"dataset indices are ints, not {type(i).__name__}")
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"item {i} out of range for {self.name or type(self).__name__} of {n}")
        if self._cache is not None:
            return self._cache[i]
        return self.load(i)

    def __iter__(self) -> Iterator[Item]:
        for i in range(len(self)):
            yield self[i]

    def preload(self) -> Dataset:
        """Load every item into memory now; later ``ds[i]`` calls only index a list."""
        if self._cache is None:
            self._cache = [self.load(i) for i in range(len(self))]
        return self

    @property
    def preloaded(self) -> bool:
        """True once :meth:`preload` has run."""
        return self._cache is not None

    def describe(self) -> dict[str, Any]:
        """Plain-JSON description for the run directory (name, size, parameters)."""
        return {
            "name": self.name,
            "items": len(self),
            "input_shape": list(self.input_shape),
            "seed": self.seed,
            "params": {k: v for k, v in self.params.items() if _is_plain(v)},
        }

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} items={len(self)} shape={self.input_shape}>"


def _is_plain(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool, list, tuple, dict))


#: name -> Dataset subclass.
DATASETS: Registry[type[Dataset]] = Registry("dataset", [DATASET_PACKAGE], base=Dataset)


def register_dataset(name: str) -> Callable[[type[Dataset]], type[Dataset]]:
    """Class decorator: make a :class:`Dataset` subclass available under ``name``."""
    return DATASETS.register(name)


def list_datasets() -> list[str]:
    """Names of every registered dataset, sorted."""
    return DATASETS.names()


def get_dataset_class(name: str) -> type[Dataset]:
    """The class registered as ``name``; an unknown name lists the valid ones."""
    return DATASETS.get(name)


def accepted_params(name_or_cls: str | type[Dataset]) -> list[str] | None:
    """Parameter names a dataset accepts, or None when it takes any (``**params``)."""
    cls = get_dataset_class(name_or_cls) if isinstance(name_or_cls, str) else name_or_cls
    sig = inspect.signature(cls.__init__)
    names = []
    for p in list(sig.parameters.values())[1:]:
        if p.kind is p.VAR_KEYWORD:
            return None
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in (
            "input_shape",
            "seed",
        ):
            names.append(p.name)
    return names


def required_params(name_or_cls: str | type[Dataset]) -> list[str]:
    """Parameters a dataset cannot do without (keyword parameters with no default)."""
    cls = get_dataset_class(name_or_cls) if isinstance(name_or_cls, str) else name_or_cls
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return [
        p.name
        for p in params
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        and p.default is p.empty
        and p.name not in ("input_shape", "seed")
    ]


def create_dataset(
    name: str, *, input_shape: tuple[int, ...], seed: int = 0, **params: Any
) -> Dataset:
    """Build dataset ``name`` for a model whose input is ``input_shape`` (no batch dim)."""
    cls = get_dataset_class(name)
    valid = accepted_params(cls)
    if valid is not None:
        for key in params:
            if key not in valid:
                raise UnknownNameError(f"{name} dataset parameter", key, valid)
    missing = [p for p in required_params(cls) if p not in params]
    if missing:
        raise TracrError(
            f"Dataset '{name}' needs params.{missing[0]}.",
            hint=f"Required parameters: {', '.join(missing)}.",
        )
    return DATASETS.create(name, input_shape=tuple(input_shape), seed=seed, **params)
