"""The built-in datasets: synthetic, image-folder (three layouts) and the shipped sample set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from experiment_design.errors import TracrError, UnknownNameError
from MyDatasets import create_dataset, list_datasets
from MyDatasets.image_folder import SAMPLE_DIR
from MyDatasets.preprocess import IMAGENET_MEAN, IMAGENET_STD

SHAPE = (3, 224, 224)


def solid(path: Path, rgb, size=(64, 48)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, rgb).save(path)
    return path


def test_builtins_are_registered():
    assert {"synthetic", "image-folder", "sample"} <= set(list_datasets())


def test_synthetic_is_deterministic_per_seed_and_item():
    a = create_dataset("synthetic", input_shape=(3, 32, 32), seed=3, size=4)
    b = create_dataset("synthetic", input_shape=(3, 32, 32), seed=3, size=4)
    c = create_dataset("synthetic", input_shape=(3, 32, 32), seed=4, size=4)
    assert len(a) == 4
    x, label, item_id = a[2]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    assert label is None and item_id == "synthetic-0002"
    assert torch.equal(x, b.preload()[2][0])  # order and preloading do not matter
    assert not torch.equal(x, c[2][0]) and not torch.equal(x, a[1][0])
    assert torch.equal(a[-1][0], a[3][0])
    with pytest.raises(IndexError):
        a[4]


def test_sample_set_shape_and_normalisation():
    ds = create_dataset("sample", input_shape=SHAPE)
    assert 6 <= len(ds) <= 10
    for f in SAMPLE_DIR.glob("*.jpg"):
        assert f.stat().st_size < 60_000
    assert (SAMPLE_DIR / "LICENSE").read_text().count("CC0") >= 1
    ds.preload()
    assert ds.preloaded
    xs = torch.stack([ds[i][0] for i in range(len(ds))])
    assert xs.shape == (len(ds), *SHAPE) and xs.dtype == torch.float32
    # Undo the normalisation: pixels must land in [0, 1].
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    pixels = xs * std + mean
    assert pixels.min() >= -1e-5 and pixels.max() <= 1 + 1e-5
    assert ds[0][1] is None and ds[0][2].endswith(".jpg")
    small = create_dataset("sample", input_shape=(1, 96, 128), limit=2)
    assert len(small) == 2 and small[1][0].shape == (1, 96, 128)


def test_sample_matches_torchvision_preprocessing():
    tv = pytest.importorskip("torchvision.transforms")
    tf = tv.Compose(
        [
            tv.Resize(256),
            tv.CenterCrop(224),
            tv.ToTensor(),
            tv.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    ds = create_dataset("sample", input_shape=SHAPE, limit=2)
    for x, _, item_id in ds:
        ref = tf(Image.open(SAMPLE_DIR / item_id).convert("RGB"))
        assert torch.allclose(x, ref, atol=1e-6)


def test_image_folder_class_subfolders(tmp_path):
    solid(tmp_path / "cat" / "a.png", (255, 0, 0))
    solid(tmp_path / "cat" / "b.jpg", (250, 0, 0))
    solid(tmp_path / "dog" / "c.png", (0, 0, 255), size=(40, 90))
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    ds = create_dataset("image-folder", input_shape=(3, 32, 32), path=str(tmp_path))
    assert ds.layout == "class-folders" and ds.class_names == ["cat", "dog"]
    assert [(lab, i) for _, lab, i in ds] == [(0, "cat/a.png"), (0, "cat/b.jpg"), (1, "dog/c.png")]
    x, _, _ = ds[2]
    assert x.shape == (3, 32, 32)
    blue = (1 - IMAGENET_MEAN[2]) / IMAGENET_STD[2]
    assert torch.allclose(x[2], torch.full((32, 32), blue), atol=1e-5)
    limited = create_dataset("image-folder", input_shape=(3, 32, 32), path=str(tmp_path), limit=1)
    assert len(limited) == 1


@pytest.mark.parametrize("sep,header", [(",", "filename,label\n"), (" ", "# comment\n")])
def test_image_folder_labels_file(tmp_path, sep, header):
    for name in ("x.png", "y.png", "z.png"):
        solid(tmp_path / "imgs" / name, (10, 200, 10))
    (tmp_path / "labels.txt").write_text(header + f"imgs/z.png{sep}7\nimgs/x.png{sep}3\n")
    ds = create_dataset(
        "image-folder", input_shape=(3, 16, 16), path=str(tmp_path), labels="labels.txt"
    )
    assert ds.layout == "labels-file"
    assert [(lab, i) for _, lab, i in ds] == [(7, "imgs/z.png"), (3, "imgs/x.png")]


def test_image_folder_named_labels_are_found_automatically(tmp_path):
    solid(tmp_path / "p.png", (0, 0, 0))
    solid(tmp_path / "q.png", (255, 255, 255))
    (tmp_path / "labels.csv").write_text("p.png,zebra\nq.png,ant\n")
    ds = create_dataset("image-folder", input_shape=(3, 8, 8), path=str(tmp_path))
    assert ds.class_names == ["ant", "zebra"]
    assert [lab for _, lab, _ in ds] == [1, 0]


def test_image_folder_flat_and_preprocess_params(tmp_path):
    arr = np.zeros((40, 80, 3), np.uint8)
    arr[:, 40:] = 255  # right half white
    Image.fromarray(arr).save(tmp_path / "half.png")
    ds = create_dataset(
        "image-folder", input_shape=(3, 20, 20), path=str(tmp_path),
        resize=20, crop=[20, 40], mean=[0.0], std=[1.0],
    )  # fmt: skip
    x, label, item_id = ds[0]
    assert label is None and item_id == "half.png" and ds.layout == "flat"
    assert x.shape == (3, 20, 40)  # an explicit crop wins over the model's size
    assert x[:, :, :18].max() == 0 and x[:, :, 22:].min() == 1


def test_image_folder_errors(tmp_path):
    with pytest.raises(TracrError, match="does not exist"):
        create_dataset("image-folder", input_shape=SHAPE, path=str(tmp_path / "nope"))
    with pytest.raises(TracrError, match="no images"):
        create_dataset("image-folder", input_shape=SHAPE, path=str(tmp_path))
    with pytest.raises(TracrError, match=r"Dataset 'image-folder' needs params\.path"):
        create_dataset("image-folder", input_shape=SHAPE)
    solid(tmp_path / "a.png", (1, 2, 3))
    (tmp_path / "labels.csv").write_text("missing.png,1\n")
    with pytest.raises(TracrError, match=r"labels.csv:1: image 'missing.png' not found"):
        create_dataset("image-folder", input_shape=SHAPE, path=str(tmp_path))
    with pytest.raises(TracrError, match="input of shape"):
        create_dataset("sample", input_shape=(10,))
    with pytest.raises(UnknownNameError, match="Did you mean 'limit'"):
        create_dataset("sample", input_shape=SHAPE, limt=2)
    with pytest.raises(UnknownNameError, match="Unknown dataset 'imagenet'"):
        create_dataset("imagenet", input_shape=SHAPE)
