"""Image preprocessing shared by every image dataset: resize, centre crop, normalise.

The same PIL + torch code runs on every participant, so an item is
bit-identical wherever it is loaded. The geometry follows torchvision's
``Resize(shorter side)`` + ``CenterCrop``; no torchvision import is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiment_design.constants import IMAGENET_MEAN, IMAGENET_STD
from experiment_design.errors import TracrError

if TYPE_CHECKING:
    from PIL.Image import Image
    from torch import Tensor

IMAGE_EXTENSIONS = (
    ".jpg",
    ".jpeg",
    ".png",
    ".bmp",
    ".gif",
    ".webp",
    ".ppm",
    ".pgm",
    ".tif",
    ".tiff",
)


def _pair(v: Any, what: str) -> tuple[int, int]:
    if isinstance(v, bool):
        raise TracrError(f"{what} must be an int or [height, width], not {v!r}")
    if isinstance(v, int):
        return v, v
    if isinstance(v, Sequence) and len(v) == 2 and all(isinstance(x, int) for x in v):
        return int(v[0]), int(v[1])
    raise TracrError(f"{what} must be an int or [height, width], not {v!r}")


class Preprocess:
    """Resize the shorter side to ``resize``, centre-crop to ``crop``, scale to [0, 1], normalise.

    ``input_shape`` is the model's (C, H, W); ``crop`` defaults to (H, W) and
    ``resize`` to 256/224 of the crop (256 for the usual 224 input). C=1
    converts to greyscale, C=3 to RGB.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        *,
        resize: int | None = None,
        crop: int | Sequence[int] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        if len(input_shape) != 3 or input_shape[0] not in (1, 3):
            raise TracrError(
                f"Image datasets need a model input of shape (1 or 3, H, W), not {tuple(input_shape)}.",
                hint="Use the 'synthetic' dataset for models with other inputs.",
            )
        self.channels = int(input_shape[0])
        self.crop = (
            _pair(crop, "crop") if crop is not None else (int(input_shape[1]), int(input_shape[2]))
        )
        if resize is None:
            resize = round(max(self.crop) * 256 / 224)
        if isinstance(resize, bool) or not isinstance(resize, int) or resize < 1:
            raise TracrError(f"resize must be a positive int (the shorter side), not {resize!r}")
        # A crop larger than the resized image would need padding; resizing a bit more is kinder.
        self.resize = max(int(resize), *self.crop)
        default_mean = IMAGENET_MEAN if self.channels == 3 else (0.449,)
        default_std = IMAGENET_STD if self.channels == 3 else (0.226,)
        self.mean = self._per_channel(mean if mean is not None else default_mean, "mean")
        self.std = self._per_channel(std if std is not None else default_std, "std")
        if any(s == 0 for s in self.std):
            raise TracrError(f"std must not contain 0, got {list(self.std)}")

    def _per_channel(self, values: Any, what: str) -> tuple[float, ...]:
        if isinstance(values, (int, float)) and not isinstance(values, bool):
            values = [values]
        try:
            vals = tuple(float(v) for v in values)
        except (TypeError, ValueError):
            raise TracrError(f"{what} must be a list of numbers, not {values!r}") from None
        if len(vals) == 1:
            vals = vals * self.channels
        if len(vals) != self.channels:
            raise TracrError(
                f"{what} needs {self.channels} values (one per channel), got {len(vals)}"
            )
        return vals

    def __call__(self, img: Image) -> Tensor:
        """Preprocess one PIL image into a (C, H, W) float32 tensor."""
        import numpy as np
        import torch
        from PIL import Image as PILImage

        img = img.convert("RGB" if self.channels == 3 else "L")
        w, h = img.size
        short, long = (w, h) if w <= h else (h, w)
        new_short, new_long = self.resize, int(self.resize * long / short)
        size = (new_short, new_long) if w <= h else (new_long, new_short)
        if size != (w, h):
            img = img.resize(size, PILImage.BILINEAR)
        w, h = img.size
        ch, cw = self.crop
        top, left = int(round((h - ch) / 2.0)), int(round((w - cw) / 2.0))
        img = img.crop((left, top, left + cw, top + ch))
        arr = np.asarray(img, dtype=np.uint8)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        x = torch.from_numpy(arr.copy()).permute(2, 0, 1).to(torch.float32).div_(255.0)
        mean = torch.tensor(self.mean, dtype=torch.float32).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32).view(-1, 1, 1)
        return x.sub_(mean).div_(std).contiguous()

    def describe(self) -> dict[str, Any]:
        """The effective settings, for the run directory."""
        return {
            "resize": self.resize,
            "crop": list(self.crop),
            "mean": list(self.mean),
            "std": list(self.std),
        }


def load_image(path: str | Path) -> Image:
    """Open an image file fully (decoded now, file closed) or raise a TracrError naming it."""
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    try:
        with PILImage.open(path) as im:
            im.load()
            return im
    except FileNotFoundError:
        raise TracrError(f"Image file not found: {path}") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise TracrError(f"Cannot read image {path}: {exc}") from None
