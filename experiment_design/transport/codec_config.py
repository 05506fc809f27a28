"""CodecConfig: how the sender encodes crossing tensors (the manifest's ``transport`` section).

The settings are checked when the config is built, so a bad value is refused while the
manifest is validated, before any device is touched; :data:`RAW` is the config that sends
tensors as they are (probes, control replies). How a config turns a tensor into bytes is
:mod:`experiment_design.transport.codec`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from experiment_design.constants import CODECS, FILTERS, GRANULARITIES, LOSSY
from experiment_design.errors import TracrError, UnknownNameError


@dataclass(frozen=True)
class CodecConfig:
    """How the sender encodes crossing tensors (the manifest's ``transport`` section).

    ``codec`` is one of :data:`CODECS` (``"none"`` sends raw bytes), ``filter`` one of
    :data:`FILTERS`, ``level`` 0-9 (0 = store), ``nthreads`` the blosc2 threads per call
    (1 by default: participants are thread-limited and their cores belong to the model).
    ``encrypt`` encrypts every frame (AES-256-GCM) on channels opened with this config;
    every frame carries an integrity tag either way. Both ends must agree on it.

    ``lossy`` (one of :data:`LOSSY`) reduces floating tensors before the codec;
    ``granularity`` ("tensor" or "channel": dim 1) is where int8/int4 take their scale
    and zero point; ``quality`` (1-100) is JPEG/WebP's. The receiver needs none of these.

    >>> CodecConfig.from_dict({"codec": "lz4", "level": 5, "lossy": "int8"}).label
    'int8+lz4-5'
    """

    codec: str = "zstd"
    level: int = 1
    filter: str = "shuffle"
    nthreads: int = 1
    encrypt: bool = False
    lossy: str = "none"
    granularity: str = "tensor"
    quality: int = 90

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise UnknownNameError("codec", str(self.codec), CODECS)
        if self.filter not in FILTERS:
            raise UnknownNameError("filter", str(self.filter), FILTERS)
        if (
            not isinstance(self.level, int)
            or isinstance(self.level, bool)
            or not 0 <= self.level <= 9
        ):
            raise TracrError(
                f"transport level must be an integer 0-9, got {self.level!r}",
                hint="0 stores without compressing, 1 is fast, 9 is the strongest",
            )
        if not isinstance(self.nthreads, int) or self.nthreads < 1:
            raise TracrError(
                f"transport nthreads must be a positive integer, got {self.nthreads!r}"
            )
        if not isinstance(self.encrypt, bool):
            raise TracrError(f"transport encrypt must be true or false, got {self.encrypt!r}")
        if self.lossy not in LOSSY:
            raise UnknownNameError(
                "lossy method",
                str(self.lossy),
                LOSSY,
                hint="none sends tensors losslessly; jpeg/webp apply to a model's input only",
            )
        if self.granularity not in GRANULARITIES:
            raise UnknownNameError(
                "granularity",
                str(self.granularity),
                GRANULARITIES,
                hint="where int8/int4 take their scale: per tensor or per channel (dim 1)",
            )
        if (
            not isinstance(self.quality, int)
            or isinstance(self.quality, bool)
            or not 1 <= self.quality <= 100
        ):
            raise TracrError(
                f"transport quality must be an integer 1-100, got {self.quality!r}",
                hint="JPEG/WebP quality: 90 is near-lossless, 50 much smaller",
            )

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> CodecConfig:
        """Build from a manifest dict; missing keys take the defaults, unknown keys are errors."""
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        extra = sorted(set(d) - known)
        if extra:
            raise TracrError(
                f"unknown transport setting(s) {extra}",
                hint=f"valid settings are {sorted(known)}",
            )
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON view (what the results store records)."""
        return asdict(self)

    @property
    def compresses(self) -> bool:
        """True when tensors are encoded (reduced or through blosc2), not sent as they are."""
        return self.codec != "none" or self.lossy != "none"

    @property
    def label(self) -> str:
        """A short, stable name of the whole transport: ``zstd-1``, ``int8c+zstd-1``,
        ``int4``, ``fp16+lz4-5``, ``jpeg-q90`` (``raw``: nothing done); the filter is named
        only when it is not the default shuffle."""
        lossless = "raw" if self.codec == "none" else f"{self.codec}-{self.level}"
        if self.codec != "none" and self.filter != "shuffle":
            lossless += f"-{self.filter if self.filter != 'none' else 'noshuffle'}"
        if self.lossy == "none":
            return lossless
        if self.lossy in ("jpeg", "webp"):
            lossy = f"{self.lossy}-q{self.quality}"
        elif self.lossy in ("int8", "int4"):
            lossy = self.lossy + ("c" if self.granularity == "channel" else "")
        else:
            lossy = {"float16": "fp16", "bfloat16": "bf16"}[self.lossy]
        return lossy if lossless == "raw" else f"{lossy}+{lossless}"


RAW = CodecConfig(codec="none", level=0, filter="none")
