"""Regenerate the sample images shipped with tracr (procedural scenes, CC0-1.0).

    python MyDatasets/sample_images/make_samples.py

Only numpy and PIL are used and every random draw is seeded, so the output
is the same on every run (JPEG bytes may differ between PIL versions).
Sizes and aspect ratios differ on purpose so resize + centre crop is exercised.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

HERE = Path(__file__).resolve().parent
QUALITY = 85


def _grid(w: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    return x / (w - 1), y / (h - 1)


def _value_noise(w: int, h: int, rng: np.random.Generator, octaves: int = 5) -> np.ndarray:
    """Smooth fractal noise in [0, 1]: bilinear-upsampled random grids, summed."""
    out = np.zeros((h, w), np.float32)
    amp, total = 1.0, 0.0
    for o in range(octaves):
        cells = 2 ** (o + 2)
        small = Image.fromarray((rng.random((cells, cells)) * 255).astype(np.uint8))
        out += amp * np.asarray(small.resize((w, h), Image.BICUBIC), np.float32) / 255
        total += amp
        amp *= 0.5
    out /= total
    return (out - out.min()) / (out.max() - out.min() + 1e-6)


def landscape(w: int = 320, h: int = 240) -> Image.Image:
    """Sky gradient, sun, two rows of hills and a lake."""
    x, y = _grid(w, h)
    sky = np.stack([90 + 120 * y, 140 + 90 * y, 235 - 40 * y], -1)
    img = Image.fromarray(sky.clip(0, 255).astype(np.uint8))
    d = ImageDraw.Draw(img)
    d.ellipse(
        (int(w * 0.7), int(h * 0.1), int(w * 0.85), int(h * 0.1 + w * 0.15)), fill=(255, 220, 120)
    )
    rng = np.random.default_rng(1)
    for base, colour in ((0.55, (70, 120, 70)), (0.68, (40, 95, 45))):
        xs = np.linspace(0, w, 24)
        ys = h * base + rng.normal(0, h * 0.04, xs.size).cumsum() * 0.4
        d.polygon(
            [(0, h)] + list(zip(xs.tolist(), ys.tolist(), strict=True)) + [(w, h)], fill=colour
        )
    d.rectangle((0, int(h * 0.82), w, h), fill=(60, 110, 170))
    return img.filter(ImageFilter.GaussianBlur(0.8))


def checkerboard(w: int = 256, h: int = 256) -> Image.Image:
    """A checkerboard seen in perspective, fading into a haze."""
    x, y = _grid(w, h)
    depth = 1.0 / (y * 0.9 + 0.1)
    u = (x - 0.5) * depth * 4
    v = depth * 2
    board = ((np.floor(u) + np.floor(v)) % 2).astype(np.float32)
    haze = np.exp(-depth * 0.15)[..., None]
    rgb = board[..., None] * np.array([230, 230, 220]) + (1 - board[..., None]) * np.array(
        [40, 40, 60]
    )
    rgb = rgb * haze + (1 - haze) * np.array([200, 210, 230])
    return Image.fromarray(rgb.clip(0, 255).astype(np.uint8))


def mandelbrot(w: int = 300, h: int = 240, iters: int = 60) -> Image.Image:
    """The Mandelbrot set, smoothly coloured."""
    x, y = _grid(w, h)
    c = (x * 3.0 - 2.2) + 1j * (y * 2.4 - 1.2)
    z = np.zeros_like(c)
    n = np.zeros(c.shape, np.float32)
    for i in range(iters):
        mask = np.abs(z) <= 2
        z[mask] = z[mask] ** 2 + c[mask]
        n[mask] = i
    t = n / iters
    rgb = np.stack([9 * (1 - t) * t**3, 15 * (1 - t) ** 2 * t**2, 8.5 * (1 - t) ** 3 * t], -1) * 255
    return Image.fromarray(rgb.clip(0, 255).astype(np.uint8))


def marble(w: int = 256, h: int = 320) -> Image.Image:
    """A marble-like texture from fractal noise."""
    rng = np.random.default_rng(4)
    x, _ = _grid(w, h)
    n = _value_noise(w, h, rng)
    veins = 0.5 + 0.5 * np.sin((x * 6 + n * 5) * np.pi)
    rgb = np.stack([200 + 50 * veins, 190 + 45 * veins, 170 + 60 * veins * n], -1)
    return Image.fromarray(rgb.clip(0, 255).astype(np.uint8))


def shapes(w: int = 320, h: int = 240) -> Image.Image:
    """Overlapping coloured circles, rectangles and triangles on a grey floor."""
    rng = np.random.default_rng(5)
    img = Image.new("RGB", (w, h), (205, 205, 200))
    d = ImageDraw.Draw(img)
    for _ in range(14):
        colour = tuple(int(c) for c in rng.integers(30, 240, 3))
        cx, cy, r = int(rng.integers(0, w)), int(rng.integers(0, h)), int(rng.integers(12, 50))
        kind = rng.integers(0, 3)
        if kind == 0:
            d.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour, outline=(20, 20, 20))
        elif kind == 1:
            d.rectangle(
                (cx - r, cy - r // 2, cx + r, cy + r // 2), fill=colour, outline=(20, 20, 20)
            )
        else:
            d.polygon(
                [(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)],
                fill=colour,
                outline=(20, 20, 20),
            )
    return img.filter(ImageFilter.GaussianBlur(0.6))


def skyline(w: int = 320, h: int = 200) -> Image.Image:
    """A city skyline at dusk with lit windows."""
    x, y = _grid(w, h)
    sky = np.stack([250 - 150 * y, 140 - 60 * y, 90 + 60 * y], -1)
    img = Image.fromarray(sky.clip(0, 255).astype(np.uint8))
    d = ImageDraw.Draw(img)
    rng = np.random.default_rng(6)
    left = 0
    while left < w:
        bw, bh = int(rng.integers(18, 45)), int(rng.integers(h // 4, int(h * 0.8)))
        d.rectangle((left, h - bh, left + bw, h), fill=(25, 25, 40))
        for wy in range(h - bh + 6, h - 6, 9):
            for wx in range(left + 4, left + bw - 4, 7):
                if rng.random() < 0.4:
                    d.rectangle((wx, wy, wx + 3, wy + 4), fill=(255, 210, 110))
        left += bw + int(rng.integers(1, 6))
    return img


def target(w: int = 240, h: int = 240) -> Image.Image:
    """Concentric rings with a radial colour wheel."""
    x, y = _grid(w, h)
    dx, dy = x - 0.5, y - 0.5
    r = np.hypot(dx, dy)
    a = np.arctan2(dy, dx)
    rings = 0.5 + 0.5 * np.cos(r * 60)
    rgb = np.stack([np.cos(a), np.cos(a + 2.1), np.cos(a + 4.2)], -1) * 0.5 + 0.5
    rgb = rgb * rings[..., None] * 255
    return Image.fromarray(rgb.clip(0, 255).astype(np.uint8))


def clouds(w: int = 320, h: int = 240) -> Image.Image:
    """Soft clouds over a blue sky (fractal noise)."""
    rng = np.random.default_rng(8)
    n = _value_noise(w, h, rng, octaves=6)
    cover = np.clip((n - 0.45) * 3, 0, 1)[..., None]
    _, y = _grid(w, h)
    sky = np.stack([60 + 60 * y, 120 + 60 * y, 220 + 20 * y], -1)
    rgb = sky * (1 - cover) + 245 * cover
    return Image.fromarray(rgb.clip(0, 255).astype(np.uint8))


SCENES = {
    "clouds": clouds,
    "checkerboard": checkerboard,
    "landscape": landscape,
    "mandelbrot": mandelbrot,
    "marble": marble,
    "shapes": shapes,
    "skyline": skyline,
    "target": target,
}


def main() -> None:
    """Write every scene as ``<name>.jpg`` next to this script and print the sizes."""
    for name, fn in SCENES.items():
        path = HERE / f"{name}.jpg"
        fn().save(path, "JPEG", quality=QUALITY, optimize=True)
        print(f"{path.name:18s} {path.stat().st_size / 1024:5.1f} KiB")


if __name__ == "__main__":
    main()
