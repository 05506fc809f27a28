"""Every figure kind tracr draws, by name, and drawing those that apply to a run.

``tracr results plot RUN --kind K --format F`` and the end of every run call
:func:`draw_kinds`; a kind that does not apply to the run (no ``configs.csv`` for
``pareto``, no memory figures for ``resources``) draws nothing, and a kind that fails is
logged and skipped: a figure must never lose a run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from app_api.results import split_plots
from app_api.results.adaptive_plot import draw_adaptive
from app_api.results.chain_plots import chain_length, draw_chain_latency, draw_timeline
from app_api.results.figstyle import load_envs
from app_api.results.pareto import DEFAULT_OBJECTIVES, pareto_front
from app_api.results.plots import draw_pareto, draw_rate_fidelity
from app_api.results.split_plots import draw_bandwidth, draw_latency
from app_api.results.store import CONFIGS_FILE, load_group, read_configs

log = logging.getLogger(__name__)


def _latency(summary: Mapping, run_dir: Path, formats: Iterable[str]) -> list[Path]:
    if chain_length(run_dir) > 2:  # a chain: per stage, not edge / transfer / cloud
        return draw_chain_latency(summary, run_dir, formats)
    return draw_latency(summary, run_dir, formats, load_envs(run_dir))


def _two_party(name: str) -> Callable:
    def draw(summary: Mapping, run_dir: Path, formats: Iterable[str]) -> list[Path]:
        if chain_length(run_dir) > 2:
            return []
        return getattr(split_plots, name)(summary, run_dir, formats, load_envs(run_dir))

    return draw


def _bandwidth(summary: Mapping, run_dir: Path, formats: Iterable[str]) -> list[Path]:
    group = load_group(run_dir)
    if group is None and chain_length(run_dir) > 2:
        return []
    return draw_bandwidth(summary if group is None else group, run_dir, formats, None, group)


def _pareto(summary: Mapping, run_dir: Path, formats: Iterable[str]) -> list[Path]:
    if not (Path(run_dir) / CONFIGS_FILE).exists():
        return []

    groups = pareto_front(read_configs(run_dir), DEFAULT_OBJECTIVES)
    out = [draw_pareto(groups, DEFAULT_OBJECTIVES, run_dir, tuple(formats))]
    return [p for p in out if p]


def _rate_fidelity(summary: Mapping, run_dir: Path, formats: Iterable[str]) -> list[Path]:
    p = draw_rate_fidelity(dict(summary), run_dir, tuple(formats)) if summary.get("codecs") \
        else None
    return [p] if p else []


def _timeline(summary: Mapping, run_dir: Path, formats: Iterable[str]) -> list[Path]:
    return draw_timeline(run_dir, formats=formats)


def _adaptive(summary: Mapping, run_dir: Path, formats: Iterable[str]) -> list[Path]:
    if not summary.get("adaptive"):
        return []

    p = draw_adaptive(dict(summary), Path(run_dir), tuple(formats))
    return [p] if p else []


#: kind -> drawing function (summary, run_dir, formats) -> paths written
KINDS: dict[str, Callable[[Mapping, Path, Iterable[str]], list[Path]]] = {
    "latency": _latency,
    "bytes": _two_party("draw_bytes"),
    "layers": _two_party("draw_layers"),
    "resources": _two_party("draw_resources"),
    "bandwidth": _bandwidth,
    "pareto": _pareto,
    "rate-fidelity": _rate_fidelity,
    "timeline": _timeline,
    "adaptive": _adaptive,
}


def draw_kinds(summary: Mapping, run_dir: Path, kinds: Iterable[str] | None = None,
               formats: Iterable[str] = ("png",)) -> list[Path]:
    """Draw ``kinds`` (all by default) of the run in ``run_dir``; returns the files
    written. A kind that fails is logged and skipped."""
    formats = tuple(formats)
    out: list[Path] = []
    for kind in kinds or KINDS:
        try:
            out += KINDS[kind](summary, Path(run_dir), formats)
        except Exception as exc:
            log.warning("%s plot not drawn: %s", kind, exc)
    return out
