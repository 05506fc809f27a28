"""The Dataset base class and the registry: user subclasses, preload, discovery, params."""

from __future__ import annotations

import sys

import pytest
import torch

from experiment_design.datasets import DATASETS
from experiment_design.errors import TracrError
from MyDatasets import Dataset, accepted_params, create_dataset, list_datasets, register_dataset


@pytest.fixture
def clean_registry(monkeypatch):
    list_datasets()  # built-ins registered before the snapshot, so restoring keeps them
    monkeypatch.setattr(DATASETS, "_entries", dict(DATASETS._entries))


def test_worked_example_subclass(clean_registry):
    loads = []

    @register_dataset("ramps")
    class Ramps(Dataset):
        def __init__(self, *, input_shape, seed=0, size=10):
            super().__init__(input_shape=input_shape, seed=seed)
            self.size = size

        def __len__(self):
            return self.size

        def load(self, i):
            loads.append(i)
            return torch.full(self.input_shape, i / self.size), i, f"ramp-{i:03d}"

    assert "ramps" in list_datasets() and Ramps.name == "ramps"
    assert accepted_params("ramps") == ["size"]
    ds = create_dataset("ramps", input_shape=(1, 2, 2), size=4)
    assert ds[1][2] == "ramp-001" and loads == [1]
    ds.preload()
    assert loads == [1, 0, 1, 2, 3]
    assert [item[1] for item in ds] == [0, 1, 2, 3] and loads == [1, 0, 1, 2, 3]
    assert ds.describe()["items"] == 4


def test_getitem_style_subclass_gets_caching(clean_registry):
    @register_dataset("plain")
    class Plain(Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return torch.zeros(self.input_shape), None, str(i)

    ds = create_dataset("plain", input_shape=(3,), anything=1)
    assert accepted_params("plain") is None  # **params: anything goes
    assert ds[1][2] == "1" and ds.preload()[0][2] == "0"
    with pytest.raises(IndexError):
        ds[2]


def test_duplicate_name_is_an_error(clean_registry):
    @register_dataset("twice")
    class A(Dataset):
        pass

    with pytest.raises(TracrError, match="registered twice"):

        @register_dataset("twice")
        class B(Dataset):
            pass


def test_user_modules_are_discovered(tmp_path, monkeypatch, clean_registry):
    """A module dropped into the MyDatasets package is imported on first use."""
    import MyDatasets

    monkeypatch.setattr(MyDatasets, "__path__", [*MyDatasets.__path__, str(tmp_path)])
    (tmp_path / "my_user_data.py").write_text(
        "from MyDatasets import Dataset, register_dataset\n"
        "@register_dataset('user-data')\n"
        "class UserData(Dataset):\n"
        "    def __len__(self):\n        return 1\n"
    )
    monkeypatch.delitem(sys.modules, "MyDatasets.my_user_data", raising=False)
    try:
        assert "user-data" in list_datasets()
        assert create_dataset("user-data", input_shape=(1,)).name == "user-data"
    finally:
        sys.modules.pop("MyDatasets.my_user_data", None)


def test_broken_user_module_is_a_clear_error(tmp_path, monkeypatch, clean_registry):
    import MyDatasets

    monkeypatch.setattr(MyDatasets, "__path__", [*MyDatasets.__path__, str(tmp_path)])
    (tmp_path / "my_broken_data.py").write_text("import not_a_real_module_xyz\n")
    with pytest.raises(
        TracrError, match="Could not import dataset module MyDatasets.my_broken_data"
    ):
        list_datasets()
