"""Split coverage of torchvision: which builders split, in which mode, and how exactly.

``tracr model coverage`` builds every torchvision builder of a family with
random weights (nothing is downloaded), prepares it for splitting
(:meth:`SplitModel.build`, graph mode with the hooks fallback), counts the valid
cuts, and runs a sample of them against the unsplit model. The families and
what each must reach:

- classification (``torchvision.models``): every builder splits exactly with
  every cut valid;
- segmentation (``torchvision.models.segmentation``; fcn, deeplabv3, lraspp,
  built with their auxiliary head where they have one, so the output is a dict
  of two maps): every builder splits exactly;
- detection (``torchvision.models.detection``): the backbone + neck of every
  builder (``model.backbone``: a dict of feature maps) splits exactly. The whole
  detector (image lists, data-dependent control flow) is tried as well and
  reported beside it, in hooks mode where fx cannot trace it.

Each model runs on the smallest input it accepts among a few sizes (64x64 for
most classifiers, 224 or 299 where a model needs it), batch 1, in eval mode.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from experiment_design.errors import TracrError, UnknownNameError

FAMILIES = ("classification", "segmentation", "detection")

#: what each family must reach, in words (the totals say whether it did)
TARGETS = {
    "classification": "every builder splits exactly with every cut valid",
    "segmentation": "every builder splits exactly",
    "detection": "the backbone + neck of every builder splits exactly",
}

DEFAULT_SAMPLE = 5
DEFAULT_TOLERANCE = 1e-5
#: above every torchvision builder (the largest, regnet_y_128gf, has 644M parameters)
DEFAULT_MAX_PARAMS = 1_000_000_000

# Square input sides tried in order; the first the unsplit model runs on is used.
_SIDES = {
    "classification": (64, 224, 299),
    "segmentation": (128, 224),
    "detection": (224, 300, 320),
}
# The whole detector resizes its input itself: R-CNNs, RetinaNet and FCOS to
# 224 instead of 800, so that trying it costs what the backbone does.
_DETECTOR_SIZE = {"min_size": 224, "max_size": 224}


def _module(family: str):
    import torchvision.models as tvm

    if family == "classification":
        return tvm
    return getattr(tvm, family)


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise UnknownNameError("model family", family, FAMILIES)


def builders(family: str) -> list[str]:
    """The torchvision builder names of ``family``, sorted."""
    import torchvision.models as tvm

    _check_family(family)
    return sorted(tvm.list_models(module=_module(family)))


@dataclass
class SplitCheck:
    """How one module splits: mode, layer and cut counts, the worst difference at the
    sampled cuts (``None`` when none ran), the number of elements of the output it
    compared (0 for a detector that found nothing: a vacuous match), and the seconds
    the build and cuts took.

    ``error`` says what stopped it (building, tracing or a cut), else ``None``.
    """

    mode: str | None = None
    layers: int | None = None
    cuts: int | None = None
    valid_cuts: int | None = None
    sampled: list[int] = field(default_factory=list)
    worst_diff: float | None = None
    output_elements: int | None = None
    seconds: float = 0.0
    error: str | None = None
    #: a valid cut inside the model (0 < k < n): cuts 0 and n leave one side empty
    inner_cut: bool = False

    def splits(self) -> bool:
        """Prepared without error, with a valid cut inside the model."""
        return self.error is None and self.inner_cut

    def exact(self, tolerance: float) -> bool:
        """Splits, and every sampled cut within ``tolerance`` of the unsplit output."""
        return self.splits() and self.worst_diff is not None and self.worst_diff <= tolerance

    def all_valid(self) -> bool:
        """Every cut valid."""
        return self.cuts is not None and self.valid_cuts == self.cuts


@dataclass
class ModelCoverage:
    """One builder's row: ``part`` is "model", or "backbone" for a detector (whose
    whole-detector attempt is ``detector``). ``status`` is "ok" (splits exactly),
    "inexact", "failed" or "skipped", with ``reason`` for the last three."""

    family: str
    model: str
    part: str
    status: str = "failed"
    reason: str | None = None
    params: int | None = None
    input_shape: list[int] | None = None
    check: SplitCheck = field(default_factory=SplitCheck)
    detector: SplitCheck | None = None

    def to_dict(self, tolerance: float) -> dict:
        """Plain JSON: the check's fields at the top level, beside ``exact``/``all_valid``."""
        check = self.check
        d = {
            "family": self.family,
            "model": self.model,
            "part": self.part,
            "status": self.status,
            "reason": self.reason,
            "params": self.params,
            "input_shape": self.input_shape,
            **{k: v for k, v in asdict(check).items() if k != "error"},
            "splits": check.splits(),
            "exact": check.exact(tolerance),
            "all_valid": check.all_valid(),
            "detector": None,
        }
        if self.detector is not None:
            det = asdict(self.detector)
            det["exact"] = self.detector.exact(tolerance)
            det["all_valid"] = self.detector.all_valid()
            det["splits"] = self.detector.splits()
            d["detector"] = det
        return d


def sample_cuts(valid: list[int], count: int) -> list[int]:
    """Up to ``count`` of the ``valid`` cuts spread evenly, always the first and the last."""
    if not valid or count < 1:
        return []
    if count == 1 or len(valid) == 1:
        return [valid[0]] if count == 1 else list(valid)
    if count >= len(valid):
        return list(valid)
    picks = {valid[round(i * (len(valid) - 1) / (count - 1))] for i in range(count)}
    return sorted(picks)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def check_split(module, x, sample: int, *, mode: str = "auto") -> SplitCheck:
    """Prepare ``module`` for splitting on ``x`` and run ``sample`` of its valid cuts
    (prefix then suffix) against ``module(x)``."""
    import torch

    # loads torch: not at tracr --help, which imports this module
    from experiment_design.split import SplitModel, flatten_output, max_abs_diff

    out = SplitCheck()
    t0 = time.perf_counter()
    try:
        sm = SplitModel.build(module, x, mode=mode)
    except Exception as exc:
        out.error = f"split: {_first_line(exc)}"
        out.seconds = time.perf_counter() - t0
        return out
    out.mode, out.layers, out.cuts = sm.mode, sm.n, len(sm.points)
    valid = sm.valid_splits()
    out.valid_cuts = len(valid)
    out.inner_cut = any(0 < k < sm.n for k in valid)
    out.sampled = sample_cuts(valid, sample)
    with torch.no_grad():
        ref = module(x)
    out.output_elements = sum(t.numel() for t in flatten_output(ref))
    worst = None
    for k in out.sampled:
        try:
            crossing, _ = sm.run_prefix(k, x)
            got, _ = sm.run_suffix(k, crossing)
        except Exception as exc:
            out.error = f"cut {k}: {_first_line(exc)}"
            break
        d = max_abs_diff(got, ref)
        worst = d if worst is None else max(worst, d)
    out.worst_diff = worst
    out.seconds = time.perf_counter() - t0
    return out


def _declared_params(name: str) -> int | None:
    """The parameter count torchvision's weights metadata gives (no build, no download)."""
    import torchvision.models as tvm

    try:
        weights = list(tvm.get_model_weights(name))
    except Exception:
        return None
    return weights[0].meta.get("num_params") if weights else None


def _build(family: str, name: str):
    import torchvision.models as tvm

    kwargs: dict[str, Any] = {"weights": None}
    if family in ("segmentation", "detection"):
        kwargs["weights_backbone"] = None
    if family == "segmentation" and not name.startswith("lraspp"):
        kwargs["aux_loss"] = True
    if family == "detection" and not name.startswith("ssd"):
        kwargs.update(_DETECTOR_SIZE)
    with warnings.catch_warnings():
        # googlenet and inception_v3 announce a future change of their default init
        warnings.simplefilter("ignore", FutureWarning)
        return tvm.get_model(name, **kwargs).eval()


def _input(module, family: str, seed: int):
    """The smallest of the family's square inputs that ``module`` runs on."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    errors = []
    for side in _SIDES[family]:
        x = torch.randn((1, 3, side, side), generator=gen)
        try:
            with torch.no_grad():
                module(x)
            return x
        except Exception as exc:
            errors.append(f"{side}: {_first_line(exc)}")
    raise TracrError(f"no input size accepted ({'; '.join(errors)})")


def cover_model(
    family: str,
    name: str,
    *,
    sample: int = DEFAULT_SAMPLE,
    tolerance: float = DEFAULT_TOLERANCE,
    max_params: int | None = DEFAULT_MAX_PARAMS,
    seed: int = 0,
) -> ModelCoverage:
    """Build torchvision builder ``name`` of ``family`` and check how it splits."""
    import torch

    row = ModelCoverage(family, name, "backbone" if family == "detection" else "model")
    row.params = _declared_params(name)
    if max_params is not None and row.params is not None and row.params > max_params:
        row.status = "skipped"
        row.reason = f"{row.params:,} parameters > --max-params {max_params:,}"
        return row
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    try:
        model = _build(family, name)
    except Exception as exc:
        row.reason = f"build: {_first_line(exc)}"
        row.check.seconds = time.perf_counter() - t0
        return row
    row.params = sum(p.numel() for p in model.parameters())
    target = model.backbone if family == "detection" else model
    try:
        x = _input(target, family, seed)
    except TracrError as exc:
        row.reason = f"input: {exc.message}"
        row.check.seconds = time.perf_counter() - t0
        return row
    row.input_shape = list(x.shape[1:])
    row.check = check_split(target, x, sample)
    row.check.seconds = time.perf_counter() - t0  # the build and the input probe included
    if row.check.error is not None:
        row.reason = row.check.error
    elif not row.check.inner_cut:
        row.reason = f"only the cuts 0 and n are valid (of {row.check.cuts})"
    elif row.check.exact(tolerance):
        row.status = "ok"
    else:
        row.status = "inexact"
        row.reason = f"max abs diff {row.check.worst_diff:.3g} > {tolerance:g}"
    if family == "detection":
        row.detector = check_split(model, x, sample)
    return row


def family_totals(family: str, rows: list[ModelCoverage], tolerance: float) -> dict:
    """One family's totals against its target (plain JSON)."""
    mine = [r for r in rows if r.family == family]
    split = [r for r in mine if r.status == "ok"]
    all_valid = [r for r in split if r.check.all_valid()]
    cuts = sum(r.check.cuts or 0 for r in mine)
    valid = sum(r.check.valid_cuts or 0 for r in mine)
    diffs = [r.check.worst_diff for r in mine if r.check.worst_diff is not None]
    goal = all_valid if family == "classification" else split
    detectors = [r for r in mine if r.detector is not None]
    totals = {
        "family": family,
        "target": TARGETS[family],
        "models": len(mine),
        "split": len(split),
        "all_cuts_valid": len(all_valid),
        "skipped": sum(r.status == "skipped" for r in mine),
        "failed": sum(r.status in ("failed", "inexact") for r in mine),
        "valid_cuts": valid,
        "cuts": cuts,
        "valid_cut_share": valid / cuts if cuts else None,
        "worst_diff": max(diffs) if diffs else None,
        "met": bool(mine) and len(goal) == len(mine),
    }
    if detectors:
        totals["detector_split"] = sum(r.detector.exact(tolerance) for r in detectors)
    return totals


def _family_of(name: str) -> str:
    for family in FAMILIES:
        if name in builders(family):
            return family
    every = [n for f in FAMILIES for n in builders(f)]
    raise UnknownNameError("torchvision builder", name, every)


def plan(families: Iterable[str] | None, models: Iterable[str] | None) -> list[tuple[str, str]]:
    """(family, builder) pairs to cover: every builder of ``families`` (default: all),
    or only ``models`` (each must be a builder of one of those families)."""
    fams = list(families) if families else list(FAMILIES)
    for f in fams:
        _check_family(f)
    if not models:
        return [(f, n) for f in fams for n in builders(f)]
    pairs = []
    for name in models:
        family = _family_of(name)
        if family not in fams:
            raise TracrError(
                f"'{name}' is a {family} builder, not one of {', '.join(fams)}",
                hint=f"add --family {family} or leave --family out",
            )
        pairs.append((family, name))
    return pairs


def run_coverage(
    pairs: list[tuple[str, str]],
    *,
    sample: int = DEFAULT_SAMPLE,
    tolerance: float = DEFAULT_TOLERANCE,
    max_params: int | None = DEFAULT_MAX_PARAMS,
    seed: int = 0,
    progress: Callable[[ModelCoverage], None] | None = None,
) -> dict:
    """Cover each (family, builder) of ``pairs``; the report as plain JSON:
    ``{"settings": ..., "models": [rows], "totals": [per family]}``."""
    if sample < 1:
        raise TracrError(f"--sample must be >= 1 (got {sample})")
    rows = []
    for family, name in pairs:
        row = cover_model(
            family, name, sample=sample, tolerance=tolerance, max_params=max_params, seed=seed
        )
        rows.append(row)
        if progress is not None:
            progress(row)
    families = [f for f in FAMILIES if any(r.family == f for r in rows)]
    return {
        "settings": {
            "sample": sample,
            "tolerance": tolerance,
            "max_params": max_params,
            "seed": seed,
        },
        "models": [r.to_dict(tolerance) for r in rows],
        "totals": [family_totals(f, rows, tolerance) for f in families],
    }
