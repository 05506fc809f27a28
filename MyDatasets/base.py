"""The :class:`Dataset` base class that every dataset subclasses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # torch is imported lazily so that listing datasets stays fast
    from torch import Tensor

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
