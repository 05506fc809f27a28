"""``image-folder`` (a directory of images on the device) and ``sample`` (the shipped set).

Three layouts are understood:

- flat: ``path/*.jpg``; items have no label;
- one sub-folder per class: ``path/<class>/*.jpg``; labels index the sorted class names;
- a labels file (``labels: labels.csv``, or ``labels.csv``/``labels.txt`` found in
  ``path``): one ``filename,label`` line per item (``#`` comments, an optional
  ``filename,label`` header); labels are ints, or class names mapped to the index
  of their sorted name. Only listed files are items, in file order.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from experiment_design.datasets import Dataset, Item, register_dataset
from experiment_design.errors import TracrError
from experiment_design.params import Param
from MyDatasets.preprocess import IMAGE_EXTENSIONS, Preprocess, load_image

SAMPLE_DIR = Path(__file__).resolve().parent / "sample_images"
_AUTO_LABEL_FILES = ("labels.csv", "labels.txt")


def _is_image(p: Path) -> bool:
    return p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".")


def _parse_label_file(path: Path, root: Path) -> tuple[list[tuple[Path, str]], str]:
    """Rows of (image path, raw label) from a ``filename,label`` file."""
    rows: list[tuple[Path, str]] = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TracrError(f"Cannot read labels file {path}: {exc}") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "," in line:
            fname, _, label = (s.strip() for s in line.partition(","))
        else:
            parts = line.split(None, 1)
            if len(parts) != 2:
                raise TracrError(
                    f"{path}:{lineno}: expected 'filename,label', got {line!r}",
                    hint="One item per line: the image file name (relative to the folder), a comma, its label.",
                )
            fname, label = parts[0], parts[1].strip()
        if not rows and fname.lower() in ("filename", "file", "image", "path"):
            continue  # header line
        img = (root / fname).resolve()
        if not img.is_file():
            raise TracrError(f"{path}:{lineno}: image '{fname}' not found in {root}")
        rows.append((img, label))
    if not rows:
        raise TracrError(f"Labels file {path} lists no images.")
    return rows, str(path)


@register_dataset("image-folder")
class ImageFolder(Dataset):
    """Images from a directory on the device, preprocessed like ImageNet evaluation.

    Params: ``path`` (required; ``~`` and ``$VARS`` expand; relative paths are
    relative to the participant's working directory), ``labels`` (a
    ``filename,label`` file, relative to ``path`` unless absolute; found
    automatically as ``labels.csv``/``labels.txt``), ``limit`` (first N items
    in sorted order), ``resize`` (shorter side, default 256 for a 224 crop),
    ``crop`` (default: the model's input size), ``mean``/``std`` (ImageNet).
    """

    PARAMS = {
        "path": Param("str", doc="a directory of images on the device"),
        "labels": Param("str", nullable=True, doc="a filename,label file"),
        "limit": Param("int", nullable=True, min=1, doc="the first N items only"),
        "resize": Param("int", nullable=True, min=1, doc="shorter side before the crop"),
    }

    def __init__(
        self,
        *,
        input_shape: tuple[int, ...],
        seed: int = 0,
        path: str,
        labels: str | None = None,
        limit: int | None = None,
        resize: int | None = None,
        crop: int | Sequence[int] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        super().__init__(
            input_shape=input_shape, seed=seed, path=path, labels=labels, limit=limit,
            resize=resize, crop=crop, mean=mean, std=std,
        )  # fmt: skip
        if not path:
            raise TracrError(
                f"Dataset '{self.name}' needs params.path (a directory of images on the device)."
            )
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise TracrError(
                f"Dataset '{self.name}': limit must be a positive int or null, not {limit!r}"
            )
        self.root = Path(os.path.expandvars(os.path.expanduser(str(path)))).resolve()
        if not self.root.is_dir():
            raise TracrError(
                f"Dataset '{self.name}': image folder {self.root} does not exist.",
                hint="params.path is read on the device that loads the dataset.",
            )
        self.preprocess = Preprocess(input_shape, resize=resize, crop=crop, mean=mean, std=std)
        self.labels_file: str | None = None
        self.layout = ""
        self.items: list[tuple[Path, int | None]] = self._scan(labels)
        if limit is not None:
            self.items = self.items[:limit]
        if not self.items:
            raise TracrError(
                f"Dataset '{self.name}': no images ({', '.join(IMAGE_EXTENSIONS)}) in {self.root}."
            )

    def _scan(self, labels: str | None) -> list[tuple[Path, int | None]]:
        label_path = None
        if labels:
            label_path = Path(os.path.expanduser(str(labels)))
            if not label_path.is_absolute():
                label_path = self.root / label_path
            if not label_path.is_file():
                raise TracrError(f"Dataset '{self.name}': labels file {label_path} not found.")
        else:
            label_path = next(
                (self.root / f for f in _AUTO_LABEL_FILES if (self.root / f).is_file()), None
            )
        if label_path is not None:
            rows, self.labels_file = _parse_label_file(label_path, self.root)
            self.layout = "labels-file"
            raw = [lab for _, lab in rows]
            if all(_is_int(lab) for lab in raw):
                return [(p, int(lab)) for p, lab in rows]
            self.class_names = sorted(set(raw))
            index = {c: i for i, c in enumerate(self.class_names)}
            return [(p, index[lab]) for p, lab in rows]
        class_dirs = sorted(
            d for d in self.root.iterdir() if d.is_dir() and any(_is_image(f) for f in d.iterdir())
        )
        top = sorted(f for f in self.root.iterdir() if _is_image(f))
        if class_dirs:
            self.layout = "class-folders"
            self.class_names = [d.name for d in class_dirs]
            items: list[tuple[Path, int | None]] = []
            for label, d in enumerate(class_dirs):
                items += [(f, label) for f in sorted(d.iterdir()) if _is_image(f)]
            # Loose files next to class folders have no class.
            return [(f, None) for f in top] + items
        self.layout = "flat"
        return [(f, None) for f in top]

    def __len__(self) -> int:
        return len(self.items)

    def load(self, i: int) -> Item:
        """Decode and preprocess item ``i``; its id is the path relative to the folder."""
        path, label = self.items[i]
        x = self.preprocess(load_image(path))
        return x, label, path.relative_to(self.root).as_posix()

    def describe(self) -> dict:
        """Name, size, layout and the effective preprocessing."""
        d = super().describe()
        d.update(
            path=str(self.root),
            layout=self.layout,
            labels_file=self.labels_file,
            classes=self.class_names,
            preprocess=self.preprocess.describe(),
        )
        return d


@register_dataset("sample")
class SampleImages(ImageFolder):
    """The small CC0 image set shipped in ``MyDatasets/sample_images/`` (no labels).

    The images are procedurally generated scenes (see ``make_samples.py``):
    they give real image statistics to the model without any download. Same
    params as ``image-folder`` except ``path``.
    """

    PARAMS = {k: p for k, p in ImageFolder.PARAMS.items() if k in ("limit", "resize")}

    def __init__(
        self,
        *,
        input_shape: tuple[int, ...],
        seed: int = 0,
        limit: int | None = None,
        resize: int | None = None,
        crop: int | Sequence[int] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        super().__init__(
            input_shape=input_shape, seed=seed, path=str(SAMPLE_DIR), limit=limit,
            resize=resize, crop=crop, mean=mean, std=std,
        )  # fmt: skip


def _is_int(s: str) -> bool:
    try:
        int(s)
    except ValueError:
        return False
    return True
